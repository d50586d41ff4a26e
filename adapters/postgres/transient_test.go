package postgres_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/middleware"
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

// serverError runs the statements of setup on one session of a fresh pool
// on the admin database, then stmt, and returns stmt's error.
func serverError(t *testing.T, setup []string, stmt string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := postgres.Open(ctx, stack.EnvFromEnvironment().AdminDatabaseURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, s := range setup {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	_, err = conn.ExecContext(ctx, stmt)
	if err == nil {
		t.Fatalf("%s succeeded", stmt)
	}
	return err
}

// Each failure the server can be made to give cheaply, for real, is the
// infrastructure's, of its class.
func TestInfrastructureClass_ServerErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	adminURL := stack.EnvFromEnvironment().AdminDatabaseURL
	table := stack.UniqueName("infra_class_")
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `CREATE TABLE `+table+` (id INT PRIMARY KEY, v INT)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), adminURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), `DROP TABLE IF EXISTS `+table)
			_ = c.Close(context.Background())
		}
	})
	if _, err := admin.Exec(ctx, `INSERT INTO `+table+` VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}

	check := func(t *testing.T, err error, class string) {
		t.Helper()
		if got := postgres.InfrastructureClass(fmt.Errorf("handler: %w", err)); got != class {
			t.Errorf("InfrastructureClass(%v) = %q, want %q", err, got, class)
		}
		if !postgres.IsTransient(err) {
			t.Errorf("IsTransient(%v) = false", err)
		}
	}
	// A lock held elsewhere, for the lock and statement timeouts.
	locked := func(t *testing.T) {
		t.Helper()
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN SHARE MODE`); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("lock timeout", func(t *testing.T) {
		locked(t)
		check(t, serverError(t, []string{`SET lock_timeout = '50ms'`}, `UPDATE `+table+` SET v = 1`), postgres.ClassLockTimeout)
	})
	t.Run("statement timeout", func(t *testing.T) {
		locked(t)
		check(t, serverError(t, []string{`SET statement_timeout = '50ms'`}, `UPDATE `+table+` SET v = 1`), postgres.ClassCanceled)
	})
	t.Run("nowait", func(t *testing.T) {
		locked(t)
		check(t, serverError(t, []string{`BEGIN`}, `LOCK TABLE `+table+` IN EXCLUSIVE MODE NOWAIT`), postgres.ClassLockTimeout)
	})
	t.Run("read-only transaction", func(t *testing.T) {
		check(t, serverError(t, []string{`SET default_transaction_read_only = on`}, `UPDATE `+table+` SET v = 1`), postgres.ClassReadOnly)
	})
	t.Run("idle session timeout", func(t *testing.T) {
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		var pid uint32
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SET idle_session_timeout = '20ms'`); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the idle session was not ended")
			}
			time.Sleep(10 * time.Millisecond)
		}
		_, err = c.Exec(ctx, `SELECT 1`)
		if err == nil {
			t.Fatal("a query on a session ended by idle_session_timeout succeeded")
		}
		if class := postgres.InfrastructureClass(err); class != postgres.ClassSessionTimeout && class != postgres.ClassConnection {
			t.Errorf("InfrastructureClass(%v) = %q, want %q or %q", err, class, postgres.ClassSessionTimeout, postgres.ClassConnection)
		}
	})
	t.Run("serialization failure", func(t *testing.T) {
		// Two serializable transactions each read what the other writes.
		a, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		b, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		for _, c := range []*pgx.Conn{a, b} {
			if _, err := c.Exec(ctx, `BEGIN ISOLATION LEVEL SERIALIZABLE`); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Exec(ctx, `SELECT sum(v) FROM `+table); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Exec(ctx, `UPDATE `+table+` SET v = v + 1 WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Exec(ctx, `UPDATE `+table+` SET v = v + 1 WHERE id = 2`); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
		_, err = b.Exec(ctx, `COMMIT`)
		if err == nil {
			t.Fatal("both serializable transactions committed")
		}
		check(t, err, postgres.ClassConflict)
	})
	t.Run("deadlock", func(t *testing.T) {
		a, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(ctx)
		b, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close(ctx)
		for _, s := range []string{`SET deadlock_timeout = '20ms'`, `BEGIN`} {
			for _, c := range []*pgx.Conn{a, b} {
				if _, err := c.Exec(ctx, s); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := a.Exec(ctx, `UPDATE `+table+` SET v = v WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Exec(ctx, `UPDATE `+table+` SET v = v WHERE id = 2`); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { _, err := a.Exec(ctx, `UPDATE `+table+` SET v = v WHERE id = 2`); errs <- err }()
		go func() { _, err := b.Exec(ctx, `UPDATE `+table+` SET v = v WHERE id = 1`); errs <- err }()
		var failed error
		for range 2 {
			if err := <-errs; err != nil {
				failed = err
				// The victim's rollback lets the other go on.
				for _, c := range []*pgx.Conn{a, b} {
					_, _ = c.Exec(context.Background(), `SELECT 1`) // no-op when aborted
				}
			}
		}
		for _, c := range []*pgx.Conn{a, b} {
			_, _ = c.Exec(ctx, `ROLLBACK`)
		}
		if failed == nil {
			t.Fatal("no deadlock detected")
		}
		check(t, failed, postgres.ClassConflict)
	})
}

// The classes that cannot be provoked cheaply, by SQLSTATE, and the
// message's own failures.
func TestInfrastructureClass_Codes(t *testing.T) {
	t.Parallel()
	for code, class := range map[string]string{
		"08000": postgres.ClassConnection, "08003": postgres.ClassConnection, "08006": postgres.ClassConnection,
		"08001": postgres.ClassConnection, "08004": postgres.ClassConnection,
		"57P01": postgres.ClassShutdown, "57P02": postgres.ClassShutdown, "57P03": postgres.ClassShutdown,
		"57P05": postgres.ClassSessionTimeout, "25P03": postgres.ClassSessionTimeout,
		"55P03": postgres.ClassLockTimeout, "57014": postgres.ClassCanceled, "25006": postgres.ClassReadOnly,
		"53000": postgres.ClassResources, "53100": postgres.ClassResources, "53200": postgres.ClassResources,
		"53300": postgres.ClassResources, "53400": postgres.ClassResources,
		"40001": postgres.ClassConflict, "40P01": postgres.ClassConflict, "40003": postgres.ClassCompletionUnknown,
		"58000": postgres.ClassSystem, "58030": postgres.ClassSystem, "58P01": postgres.ClassSystem,
		// The message's own.
		"23505": "", "23502": "", "22012": "", "42601": "", "42P01": "", "40002": "", "P0001": "", "25001": "",
	} {
		err := fmt.Errorf("apply: %w", &pgconn.PgError{Code: code, Message: "test"})
		if got := postgres.InfrastructureClass(err); got != class {
			t.Errorf("%s: InfrastructureClass = %q, want %q", code, got, class)
		}
		if got := postgres.IsTransient(err); got != (class != "") {
			t.Errorf("%s: IsTransient = %v, want %v", code, got, class != "")
		}
	}
	for _, err := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, driver.ErrBadConn, sql.ErrConnDone} {
		if got := postgres.InfrastructureClass(fmt.Errorf("x: %w", err)); got != postgres.ClassConnection {
			t.Errorf("%v: InfrastructureClass = %q, want %q", err, got, postgres.ClassConnection)
		}
	}
	if got := postgres.InfrastructureClass(fmt.Errorf("x: %w", context.DeadlineExceeded)); got != postgres.ClassTimeout {
		t.Errorf("deadline: InfrastructureClass = %q, want %q", got, postgres.ClassTimeout)
	}
}

// memStore is a set-aside store that keeps the messages in memory.
type memStore struct{ set []middleware.SetAsideMessage }

func (s *memStore) SetAside(_ context.Context, m middleware.SetAsideMessage) error {
	s.set = append(s.set, m)
	return nil
}

// "Infrastructure failures are never set aside", through the consumer's
// chain (set-aside around retry), for every SQLSTATE of the table: a
// handler failing with one far more often than its attempts allow is
// retried until it succeeds, spending no attempt; one of the message's own
// is set aside after its attempts.
func TestInfrastructureFailures_NeverSetAside(t *testing.T) {
	t.Parallel()
	codes := []string{"08006", "57P01", "57P02", "57P03", "57P05", "25P03", "55P03", "57014", "25006",
		"53100", "53200", "53300", "53400", "40001", "40P01", "40003", "58000", "58030"}
	for _, code := range append(codes, "23505") {
		store := &memStore{}
		retried := 0
		retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Microsecond, MaxInterval: time.Microsecond,
			MaxOutageInterval: time.Microsecond, Infrastructure: postgres.IsTransient,
			OnRetry: func(*message.Message, int, error) { retried++ }}
		calls := 0
		h := middleware.SetAside{Store: store, Handler: "h", IsTransient: postgres.IsTransient}.Middleware(
			retry.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls++
				if calls <= 20 {
					return nil, fmt.Errorf("apply: %w", &pgconn.PgError{Code: code})
				}
				return nil, nil
			}))
		msg := message.NewMessage("m-"+code, nil)
		if _, err := h(msg); err != nil {
			t.Errorf("%s: chain failed: %v", code, err)
		}
		if code == "23505" {
			if len(store.set) != 1 || calls != 3 {
				t.Errorf("%s (the message's own): set aside %d after %d calls, want 1 after 3", code, len(store.set), calls)
			}
			continue
		}
		if len(store.set) != 0 || calls != 21 || retried != 0 {
			t.Errorf("%s: set aside %d, %d calls, %d attempts spent; want 0, 21, 0", code, len(store.set), calls, retried)
		}
	}
}
