package postgres_test

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

// countingMigrations are migrations that fail or double their effect when
// run twice or out of order: the first creates the table log without IF NOT
// EXISTS, each one appends a row naming itself to it.
func countingMigrations(log string) fstest.MapFS {
	return fstest.MapFS{
		"002_second.sql": {Data: []byte(`INSERT INTO ` + log + ` (name) VALUES ('002');`)},
		"001_first.sql": {Data: []byte(`
			CREATE TABLE ` + log + ` (id SERIAL PRIMARY KEY, name TEXT NOT NULL);
			INSERT INTO ` + log + ` (name) VALUES ('001');`)},
		"README.md": {Data: []byte(`not a migration`)},
	}
}

// applied returns the migrations recorded for owner, in name order.
func applied(t *testing.T, db *testdb.DB, owner string) []string {
	t.Helper()
	var names []string
	if err := db.SelectContext(context.Background(), &names, `SELECT name FROM `+owner+`_schema_migrations ORDER BY name`); err != nil {
		t.Fatalf("read applied migrations: %v", err)
	}
	return names
}

// sqlFiles returns the names of the *.sql files of migrations, sorted.
func sqlFiles(t *testing.T, migrations fs.FS) []string {
	t.Helper()
	names, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// migrateConcurrently runs Migrate from n instances (connection pools) at
// once and returns their errors.
func migrateConcurrently(t *testing.T, db *testdb.DB, n int, owner string, migrations fs.FS) []error {
	t.Helper()
	pools := make([]*sqlx.DB, n)
	for i := range pools {
		pool, err := postgres.Open(context.Background(), db.URL, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pools[i] = pool
	}
	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, pool := range pools {
		wg.Go(func() {
			<-start
			errs[i] = postgres.Migrate(context.Background(), pool, owner, migrations)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	// The subtests share a fresh database; each migrates its own owner and
	// tables.
	db := testdb.New(t)

	t.Run("concurrent instances apply each migration once", func(t *testing.T) {
		t.Parallel()
		for owner, migrations := range map[string]fs.FS{
			postgres.FrameworkOwner: postgres.Migrations(),
			"counting":              countingMigrations("concurrent_log"),
		} {
			for i, err := range migrateConcurrently(t, db, 4, owner, migrations) {
				if err != nil {
					t.Errorf("instance %d migrating %s: %v", i, owner, err)
				}
			}
			if got, want := applied(t, db, owner), sqlFiles(t, migrations); !slices.Equal(got, want) {
				t.Errorf("%s: recorded %v, want %v", owner, got, want)
			}
		}
		var log []string
		if err := db.SelectContext(context.Background(), &log, `SELECT name FROM concurrent_log ORDER BY id`); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(log, []string{"001", "002"}) {
			t.Errorf("migrations ran as %v, want each once in name order [001 002]", log)
		}
	})

	t.Run("re-running is a no-op", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		migrations := countingMigrations("rerun_log")
		if err := postgres.Migrate(ctx, db.DB, "rerun", migrations); err != nil {
			t.Fatal(err)
		}
		var before []time.Time
		if err := db.SelectContext(ctx, &before, `SELECT applied_at FROM rerun_schema_migrations ORDER BY name`); err != nil {
			t.Fatal(err)
		}
		if err := postgres.Migrate(ctx, db.DB, "rerun", migrations); err != nil {
			t.Fatalf("second run: %v", err)
		}
		var after []time.Time
		if err := db.SelectContext(ctx, &after, `SELECT applied_at FROM rerun_schema_migrations ORDER BY name`); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(before, after, time.Time.Equal) {
			t.Errorf("applied_at changed from %v to %v", before, after)
		}
		if n := db.Count(t, `SELECT count(*) FROM rerun_log`); n != 2 {
			t.Errorf("rerun_log holds %d rows, want 2", n)
		}

		// A migration added later is applied on the next run, alone.
		grown := fstest.MapFS{"003_third.sql": {Data: []byte(`INSERT INTO rerun_log (name) VALUES ('003');`)}}
		for name, f := range migrations {
			grown[name] = f
		}
		if err := postgres.Migrate(ctx, db.DB, "rerun", grown); err != nil {
			t.Fatal(err)
		}
		if got := applied(t, db, "rerun"); !slices.Equal(got, sqlFiles(t, grown)) {
			t.Errorf("recorded %v", got)
		}
		if n := db.Count(t, `SELECT count(*) FROM rerun_log`); n != 3 {
			t.Errorf("rerun_log holds %d rows, want 3", n)
		}
	})

	t.Run("a broken migration fails and leaves no trace", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		broken := fstest.MapFS{
			"001_good.sql": {Data: []byte(`CREATE TABLE broken_good (id INT);`)},
			// The first statement succeeds; the second fails.
			"002_broken.sql": {Data: []byte(`CREATE TABLE broken_half_done (id INT); INSERT INTO no_such_table VALUES (1);`)},
			"003_after.sql":  {Data: []byte(`CREATE TABLE broken_after (id INT);`)},
		}
		err := postgres.Migrate(ctx, db.DB, "broken", broken)
		if err == nil {
			t.Fatal("Migrate succeeded")
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Errorf("got %v, want the undefined_table error of the broken statement", err)
		}
		if !strings.Contains(err.Error(), "002_broken.sql") {
			t.Errorf("error %q does not name the broken file", err)
		}
		if got := applied(t, db, "broken"); !slices.Equal(got, []string{"001_good.sql"}) {
			t.Errorf("recorded %v, want only 001_good.sql", got)
		}
		for table, want := range map[string]bool{"broken_good": true, "broken_half_done": false, "broken_after": false} {
			var exists bool
			if err := db.GetContext(ctx, &exists, `SELECT to_regclass($1) IS NOT NULL`, table); err != nil {
				t.Fatal(err)
			}
			if exists != want {
				t.Errorf("table %s exists: %v, want %v", table, exists, want)
			}
		}

		// Once fixed, the run resumes where it stopped.
		broken["002_broken.sql"] = &fstest.MapFile{Data: []byte(`CREATE TABLE broken_half_done (id INT);`)}
		if err := postgres.Migrate(ctx, db.DB, "broken", broken); err != nil {
			t.Fatalf("after the fix: %v", err)
		}
		if got := applied(t, db, "broken"); !slices.Equal(got, sqlFiles(t, broken)) {
			t.Errorf("after the fix recorded %v", got)
		}
	})
}
