package pgbatch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // a PostgreSQL driver other than pgx

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// newTable creates table items (id int primary key, xid xid8) in a test's
// own database.
func newTable(t *testing.T) *testdb.DB {
	t.Helper()
	db := testdb.New(t)
	if _, err := db.Exec(`CREATE TABLE items (id int PRIMARY KEY, xid xid8 NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return db
}

const insertItem = `INSERT INTO items (id, xid) VALUES ($1, pg_current_xact_id())`

// commitItems commits one insert per id, labelled "insert item <id>", in
// one Tx.
func commitItems(ctx context.Context, db *testdb.DB, ids ...int) error {
	var tx pgbatch.Tx
	for _, id := range ids {
		tx.Exec(fmt.Sprintf("insert item %d", id), insertItem, id)
	}
	return tx.Commit(ctx, db.DB)
}

func TestTx_Commit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("runs every statement in one transaction", func(t *testing.T) {
		t.Parallel()
		db := newTable(t)
		var tx pgbatch.Tx
		for id := 1; id <= 3; id++ {
			tx.Exec("insert item", insertItem, id)
		}
		if tx.Len() != 3 {
			t.Fatalf("Len() = %d, want 3", tx.Len())
		}
		if n := db.Count(t, `SELECT count(*) FROM items`); n != 0 {
			t.Fatalf("%d rows before the commit, want none", n)
		}
		if err := tx.Commit(ctx, db.DB); err != nil {
			t.Fatal(err)
		}
		if tx.Len() != 0 {
			t.Errorf("Len() = %d after the commit, want 0", tx.Len())
		}
		if n := db.Count(t, `SELECT count(*) FROM items`); n != 3 {
			t.Fatalf("%d rows after the commit, want 3", n)
		}
		if n := db.Count(t, `SELECT count(DISTINCT xid) FROM items`); n != 1 {
			t.Errorf("the rows were written by %d transactions, want 1", n)
		}
	})

	t.Run("a failing statement undoes the others", func(t *testing.T) {
		t.Parallel()
		db := newTable(t)
		err := commitItems(ctx, db, 1, 2, 1, 3)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Fatalf("got %v, want a unique violation", err)
		}
		if !strings.HasPrefix(err.Error(), "insert item 1: ") {
			t.Errorf("error %q does not name the failing statement first", err)
		}
		var failed *pgbatch.StatementError
		if !errors.As(err, &failed) || failed.Label != "insert item 1" || failed.Index != 2 {
			t.Errorf("got %#v, want a *StatementError of the third statement, labelled insert item 1", err)
		}
		if n := db.Count(t, `SELECT count(*) FROM items`); n != 0 {
			t.Errorf("%d rows stored by a failed transaction, want none", n)
		}
		// The connection is clean for the next transaction.
		if err := commitItems(ctx, db, 1); err != nil {
			t.Fatalf("the next transaction: %v", err)
		}
	})

	t.Run("a statement without a label is named by its first words", func(t *testing.T) {
		t.Parallel()
		db := newTable(t)
		var tx pgbatch.Tx
		for range 2 {
			if _, err := tx.ExecContext(ctx, insertItem, 1); err != nil {
				t.Fatal(err)
			}
		}
		err := tx.Commit(ctx, db.DB)
		if want := "INSERT INTO items (id, ...: "; err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v, want an error starting %q", err, want)
		}
	})

	t.Run("a terminated connection leaves the pool usable", func(t *testing.T) {
		t.Parallel()
		db := newTable(t)
		if err := commitItems(ctx, db, 1); err != nil {
			t.Fatal(err)
		}
		// The pooled connection's backend goes away under it.
		admin := testdb.New(t)
		if _, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db.Name); err != nil {
			t.Fatal(err)
		}
		// A Tx that failed is committed again, on a fresh connection.
		var second pgbatch.Tx
		second.Exec("insert item 2", insertItem, 2)
		second.Exec("insert item 3", insertItem, 3)
		if err := second.Commit(ctx, db.DB); err != nil {
			// Refused on the dead connection: then nothing of it was stored.
			if n := db.Count(t, `SELECT count(*) FROM items WHERE id > 1`); n != 0 {
				t.Fatalf("the failed transaction (%v) stored %d rows", err, n)
			}
			if err := second.Commit(ctx, db.DB); err != nil {
				t.Fatalf("the transaction again on a fresh connection: %v", err)
			}
		}
		if n := db.Count(t, `SELECT count(*) FROM items`); n != 3 {
			t.Errorf("%d rows, want 3", n)
		}
	})

	t.Run("queues a watermill-sql publisher's insert", func(t *testing.T) {
		t.Parallel()
		db := testdb.New(t)
		schema := wmsql.DefaultPostgreSQLSchema{}
		queries, err := schema.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: "batched"})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range queries {
			if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
				t.Fatal(err)
			}
		}
		var tx pgbatch.Tx
		pub, err := wmsql.NewPublisher(&tx, wmsql.PublisherConfig{SchemaAdapter: schema}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`))
		if err := pub.Publish("batched", msg); err != nil {
			t.Fatal(err)
		}
		table := schema.MessagesTable("batched")
		if n := db.Count(t, `SELECT count(*) FROM `+table); n != 0 {
			t.Fatalf("%d rows before the commit, want none", n)
		}
		if err := tx.Commit(ctx, db.DB); err != nil {
			t.Fatal(err)
		}
		if n := db.Count(t, `SELECT count(*) FROM `+table+` WHERE uuid = $1`, msg.UUID); n != 1 {
			t.Errorf("%d rows of the message after the commit, want 1", n)
		}
	})

	t.Run("an empty transaction does not connect", func(t *testing.T) {
		t.Parallel()
		db := sqlx.MustOpen("pgx", "postgres://nobody@127.0.0.1:1/none")
		defer db.Close()
		var tx pgbatch.Tx
		if err := tx.Commit(ctx, db); err != nil {
			t.Errorf("empty commit: %v", err)
		}
	})

	t.Run("other drivers are refused before anything is sent", func(t *testing.T) {
		t.Parallel()
		pgx := newTable(t)
		db, err := sqlx.Open("postgres", pgx.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if pgbatch.Supported(db) {
			t.Error("Supported reports lib/pq's driver as supported")
		}
		if !pgbatch.Supported(pgx.DB) {
			t.Error("Supported reports pgx's driver as unsupported")
		}
		var tx pgbatch.Tx
		tx.Exec("insert item", insertItem, 1)
		if err := tx.Commit(ctx, db); !errors.Is(err, pgbatch.ErrUnsupportedDriver) {
			t.Fatalf("got %v, want ErrUnsupportedDriver", err)
		}
		if n := pgx.Count(t, `SELECT count(*) FROM items`); n != 0 {
			t.Errorf("%d rows stored, want none", n)
		}
	})
}

func TestTx_ExecContext(t *testing.T) {
	t.Parallel()
	var tx pgbatch.Tx
	res, err := tx.ExecContext(context.Background(), insertItem, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.RowsAffected(); !errors.Is(err, pgbatch.ErrNotRun) {
		t.Errorf("RowsAffected before the commit: %v, want ErrNotRun", err)
	}
	if tx.Len() != 1 {
		t.Errorf("Len() = %d, want 1", tx.Len())
	}
	if _, err := tx.QueryContext(context.Background(), `SELECT 1`); !errors.Is(err, pgbatch.ErrNoRows) {
		t.Errorf("QueryContext: %v, want ErrNoRows", err)
	}
}
