package tests

import (
	"context"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/testdb"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/relay"
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
func outboxBacklog(t *testing.T, url string) int {
	t.Helper()
	db, err := postgres.Open(context.Background(), url, 1)
	if err != nil {
		return -1
	}
	defer db.Close()
	st, err := outbox.Inspect(context.Background(), db, testdb.Outbox, relay.DefaultConsumerGroup, time.Hour)
	if err != nil {
		return -1
	}
	return int(st.Backlog)
}
