package retention

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRule_Validate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		rule    Rule
		wantErr string
	}{
		{"ok", Rule{Table: "keys", Column: "created_at", Keep: time.Hour}, ""},
		{"schema-qualified", Rule{Table: "app.keys", Column: "created_at", Keep: time.Hour}, ""},
		{"injected table", Rule{Table: "keys; DROP TABLE x", Column: "created_at", Keep: time.Hour}, "not a lower-case identifier"},
		{"qualified column", Rule{Table: "keys", Column: "k.created_at", Keep: time.Hour}, "column"},
		{"zero keep", Rule{Table: "keys", Column: "created_at"}, "must be positive"},
		{"negative keep", Rule{Table: "keys", Column: "created_at", Keep: -time.Hour}, "must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rule.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate() = %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := NewRulePurger(nil, Rule{Table: "keys", Column: "created_at"}, Config{}); err == nil {
		t.Fatal("NewRulePurger with an invalid rule: no error")
	}
}

func TestPurger_PurgeRule(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `
		CREATE TABLE keys (key TEXT PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL);
		INSERT INTO keys SELECT 'old-' || i, now() - interval '2 hours' - i * interval '1 second' FROM generate_series(1, 5) i;
		INSERT INTO keys SELECT 'new-' || i, now() - interval '30 minutes' FROM generate_series(1, 3) i`); err != nil {
		t.Fatal(err)
	}
	p, err := NewRulePurger(db.DB, Rule{Table: "keys", Column: "created_at", Keep: time.Hour}, Config{BatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	dry, err := p.Purge(ctx, true)
	if err != nil || dry.Purged != 5 || dry.Held != 0 || dry.Table != "keys" || dry.OlderThan != time.Hour {
		t.Fatalf("dry run = %+v, %v; want 5 purgeable", dry, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM keys`); n != 8 {
		t.Fatalf("dry run deleted rows: %d left", n)
	}
	res, err := p.Purge(ctx, false)
	if err != nil || res.Purged != 5 || res.Batches != 3 {
		t.Fatalf("purge = %+v, %v; want 5 rows in 3 batches of at most 2", res, err)
	}
	if n := db.Count(t, `SELECT count(*) FROM keys WHERE key LIKE 'new-%'`); n != 3 || db.Count(t, `SELECT count(*) FROM keys`) != 3 {
		t.Fatalf("rows left: want the 3 recent ones")
	}
}
