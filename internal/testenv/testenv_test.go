package testenv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// connect connects to url for the rest of t.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// requireLogical fails t unless the server runs with wal_level=logical, which
// logical replication slots need.
func requireLogical(t *testing.T, env Env) {
	t.Helper()
	var level string
	if err := connect(t, env.AdminDatabaseURL).QueryRow(context.Background(), `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "logical" {
		t.Fatalf("the server runs with wal_level=%s; logical slots need logical (scripts/services.sh sets it)", level)
	}
}

// newDatabase creates a database for t, dropped when t ends if it is still
// there.
func newDatabase(t *testing.T, env Env) string {
	t.Helper()
	name := UniqueName("obm_testenv_")
	if err := env.CreateDatabase(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.DropDatabase(context.Background(), name); err != nil {
			t.Errorf("clean up: %v", err)
		}
	})
	return name
}

// slotPID returns the active_pid of slot (0 when inactive) and whether the
// slot exists.
func slotPID(t *testing.T, admin *pgx.Conn, slot string) (int32, bool) {
	t.Helper()
	var pid *int32
	err := admin.QueryRow(context.Background(),
		`SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if pid == nil {
		return 0, true
	}
	return *pid, true
}

// dropAndCheck drops database name with DropDatabase and checks that the
// database and slot are gone.
func dropAndCheck(t *testing.T, env Env, admin *pgx.Conn, name, slot string) {
	t.Helper()
	ctx := context.Background()
	if err := env.DropDatabase(ctx, name); err != nil {
		t.Fatalf("DropDatabase: %v", err)
	}
	if _, ok := slotPID(t, admin, slot); ok {
		t.Errorf("slot %s still exists", slot)
	}
	var exists bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s still exists", name)
	}
}

func TestEnv_DropDatabase(t *testing.T) {
	t.Parallel()
	env := FromEnvironment()
	requireLogical(t, env)

	t.Run("inactive slot", func(t *testing.T) {
		t.Parallel()
		admin := connect(t, env.AdminDatabaseURL)
		name := newDatabase(t, env)
		slot := UniqueName("obm_slot_")
		db := connect(t, env.DatabaseURL(name))
		if _, err := db.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
			t.Fatal(err)
		}
		db.Close(context.Background())
		if pid, ok := slotPID(t, admin, slot); !ok || pid != 0 {
			t.Fatalf("slot %s: active_pid %d, exists %t; want an inactive slot", slot, pid, ok)
		}
		dropAndCheck(t, env, admin, name, slot)
	})

	t.Run("slot streaming to a walsender", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		admin := connect(t, env.AdminDatabaseURL)
		name := newDatabase(t, env)
		slot := UniqueName("obm_slot_")
		if _, err := connect(t, env.DatabaseURL(name)).Exec(ctx, `CREATE PUBLICATION everything FOR ALL TABLES`); err != nil {
			t.Fatal(err)
		}
		cfg, err := pgconn.ParseConfig(env.DatabaseURL(name))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["replication"] = "database"
		repl, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer repl.Close(ctx)
		if _, err := pglogrepl.CreateReplicationSlot(ctx, repl, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
			t.Fatal(err)
		}
		err = pglogrepl.StartReplication(ctx, repl, slot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'everything'"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if pid, ok := slotPID(t, admin, slot); !ok || pid != int32(repl.PID()) {
			t.Fatalf("slot %s: active_pid %d, exists %t; want the walsender %d", slot, pid, ok, repl.PID())
		}
		dropAndCheck(t, env, admin, name, slot)
		// The stream ends with the walsender's termination (keepalives may
		// come first).
		recvCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for {
			_, err := repl.ReceiveMessage(recvCtx)
			if err == nil {
				continue
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "57P01" { // admin_shutdown
				t.Errorf("the stream ended with %v; want the walsender terminated", err)
			}
			break
		}
	})

	t.Run("temporary slot of a session", func(t *testing.T) {
		t.Parallel()
		admin := connect(t, env.AdminDatabaseURL)
		name := newDatabase(t, env)
		slot := UniqueName("obm_slot_")
		db := connect(t, env.DatabaseURL(name))
		if _, err := db.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput', true)`, slot); err != nil {
			t.Fatal(err)
		}
		if pid, ok := slotPID(t, admin, slot); !ok || pid != int32(db.PgConn().PID()) {
			t.Fatalf("slot %s: active_pid %d, exists %t; want the session %d", slot, pid, ok, db.PgConn().PID())
		}
		dropAndCheck(t, env, admin, name, slot)
	})
}
