package pgbatch_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/pgbatch"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// A Tx queues statements and sends them, with BEGIN and COMMIT, in one
// round trip: all of them take effect, or none.
func ExampleTx_Commit() {
	db, drop := exampleenv.EmptyDB(`CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)`)
	defer drop()
	ctx := context.Background()

	var tx pgbatch.Tx
	tx.Exec("insert item 1", `INSERT INTO items (id, name) VALUES ($1, $2)`, 1, "kettle")
	tx.Exec("insert item 2", `INSERT INTO items (id, name) VALUES ($1, $2)`, 2, "teapot")
	fmt.Println("queued:", tx.Len())
	if err := tx.Commit(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("queued after commit:", tx.Len())

	// A failing statement undoes the whole transaction; the error names it
	// and wraps PostgreSQL's.
	tx.Exec("insert item 3", `INSERT INTO items (id, name) VALUES ($1, $2)`, 3, "cup")
	tx.Exec("insert item 1 again", `INSERT INTO items (id, name) VALUES ($1, $2)`, 1, "mug")
	err := tx.Commit(ctx, db)
	var pgErr *pgconn.PgError
	fmt.Println("failed:", errors.As(err, &pgErr) && pgErr.Code == "23505")

	var n int
	if err := db.GetContext(ctx, &n, `SELECT count(*) FROM items`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("items:", n)
	// Output:
	// queued: 2
	// queued after commit: 0
	// failed: true
	// items: 2
}

// A Tx cannot read: the count of rows a statement changed is known only
// after the commit.
func ExampleTx_ExecContext() {
	var tx pgbatch.Tx
	res, err := tx.ExecContext(context.Background(), `DELETE FROM items WHERE id = $1`, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = res.RowsAffected()
	fmt.Println(errors.Is(err, pgbatch.ErrNotRun))
	_, err = tx.QueryContext(context.Background(), `SELECT 1`)
	fmt.Println(errors.Is(err, pgbatch.ErrNoRows))
	// Output:
	// true
	// true
}
