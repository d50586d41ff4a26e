package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// OpenTransaction is a transaction open on the database server, as
// pg_stat_activity shows it.
type OpenTransaction struct {
	PID         int           `json:"pid"`
	Database    string        `json:"database"`
	User        string        `json:"user"`
	Application string        `json:"application"`
	State       string        `json:"state"`
	Age         time.Duration `json:"age_ns"`
	// HasXID reports whether the transaction holds a transaction id (it
	// wrote something). Only such transactions hold back the snapshot xmin
	// that watermill-sql's outbox reader waits for.
	HasXID bool `json:"has_xid"`
}

// OldestTransactions returns the oldest open transaction of any client
// session on the server (other than the caller's own), and the oldest among
// those that hold a transaction id; either is nil when there is none.
//
// The outbox reader forwards only rows of transactions older than every
// transaction still running on the server (pg_snapshot_xmin is server-wide),
// so one long writing transaction in any database stalls every relay on the
// server; a long read-only one holds back vacuum. A role that is neither
// superuser nor member of pg_read_all_stats does not see other roles'
// transactions.
func OldestTransactions(ctx context.Context, db sqlx.QueryerContext) (oldest, oldestWriting *OpenTransaction, err error) {
	get := func(cond string) (*OpenTransaction, error) {
		var t OpenTransaction
		var ageSeconds float64
		err := db.QueryRowxContext(ctx, `
			SELECT pid, coalesce(datname, ''), coalesce(usename, ''), coalesce(application_name, ''),
			       coalesce(state, ''), extract(epoch FROM clock_timestamp() - xact_start),
			       backend_xid IS NOT NULL
			FROM pg_stat_activity
			WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()
			  AND backend_type = 'client backend' `+cond+`
			ORDER BY xact_start LIMIT 1`).
			Scan(&t.PID, &t.Database, &t.User, &t.Application, &t.State, &ageSeconds, &t.HasXID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read open transactions: %w", err)
		}
		t.Age = max(0, time.Duration(ageSeconds*float64(time.Second)))
		return &t, nil
	}
	if oldest, err = get(""); err != nil {
		return nil, nil, err
	}
	if oldestWriting, err = get("AND backend_xid IS NOT NULL"); err != nil {
		return nil, nil, err
	}
	return oldest, oldestWriting, nil
}
