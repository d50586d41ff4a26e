package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/stack"
)

func TestIsTransient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := stack.EnvFromEnvironment().AdminDatabaseURL

	t.Run("terminated session", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, adminURL, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var pid int
		if err := db.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		var ok bool
		if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate session %d: %v %v", pid, ok, err)
		}
		_, err = db.ExecContext(ctx, `SELECT 1`)
		if err == nil {
			t.Fatal("a query on the terminated session succeeded")
		}
		if !postgres.IsTransient(fmt.Errorf("dedup: begin: %w", err)) {
			t.Errorf("IsTransient(%v) = false, want true", err)
		}
	})

	t.Run("cannot connect", func(t *testing.T) {
		t.Parallel()
		_, err := postgres.Open(ctx, "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", 1)
		if err == nil {
			t.Fatal("connected to port 1")
		}
		if !postgres.IsTransient(err) {
			t.Errorf("IsTransient(%v) = false, want true", err)
		}
	})

	t.Run("statement errors", func(t *testing.T) {
		t.Parallel()
		db, err := postgres.Open(ctx, adminURL, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `CREATE TEMP TABLE transient_test (id INT PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{
			`INSERT INTO transient_test VALUES (1), (1)`,
			`INSERT INTO transient_test VALUES (NULL)`,
			`SELEC 1`,
			`SELECT 1/0`,
		} {
			_, err := conn.ExecContext(ctx, stmt)
			if err == nil {
				t.Fatalf("%s succeeded", stmt)
			}
			if postgres.IsTransient(err) {
				t.Errorf("%s: IsTransient(%v) = true, want false", stmt, err)
			}
		}
	})

	t.Run("no database error", func(t *testing.T) {
		t.Parallel()
		for _, err := range []error{nil, errors.New("payload of OrderPaid: unknown field")} {
			if postgres.IsTransient(err) {
				t.Errorf("IsTransient(%v) = true, want false", err)
			}
		}
	})
}
