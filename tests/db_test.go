package tests

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/outbox"
)

// openDB connects to url for the rest of the test.
func openDB(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// outboxBacklog counts outbox rows the relay has not passed yet, or -1 when
// it cannot tell.
func outboxBacklog(db *pgx.Conn) int {
	cfg := outbox.DefaultConfig()
	var n int
	err := db.QueryRow(context.Background(), `
		SELECT count(*) FROM `+cfg.Table()+` m
		WHERE NOT EXISTS (
			SELECT 1 FROM `+cfg.OffsetsTable()+` o
			WHERE (m.transaction_id, m."offset") <= (o.last_processed_transaction_id, o.offset_acked)
		)`).Scan(&n)
	if err != nil {
		return -1
	}
	return n
}
