package module_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules/orders"
)

func TestConfig_Validate_Limits(t *testing.T) {
	t.Parallel()
	set := module.Set{accounts(), audit()}
	valid := module.Config{Run: []string{"accounts"}, DatabaseURL: "postgres://x", AMQPURL: "amqp://x"}
	for _, tc := range []struct {
		name   string
		change func(*module.Config)
		want   string // "" for valid
	}{
		{"zeros are the defaults", func(c *module.Config) {}, ""},
		{"largest prefetch", func(c *module.Config) { c.Prefetch = 65535 }, ""},
		{"prefetch past 16 bits", func(c *module.Config) { c.Prefetch = 70000 }, "-prefetch 70000 is outside 1..65535"},
		{"negative prefetch", func(c *module.Config) { c.Prefetch = -1 }, "-prefetch -1 must not be negative"},
		{"negative batch", func(c *module.Config) { c.MaxBatch = -2 }, "-batch -2 must not be negative"},
		{"batch above the prefetch", func(c *module.Config) { c.MaxBatch, c.Prefetch = 100, 64 }, "batches of 100 cannot fill with a prefetch of 64"},
		{"negative transactions", func(c *module.Config) { c.Transactions = -1 }, "-transactions -1 must not be negative"},
		{"transactions past the bound", func(c *module.Config) { c.Transactions = 65536 }, "-transactions 65536 is outside 1..65535"},
		{"retries", func(c *module.Config) { c.Retry = middleware.Retry{MaxRetries: 101} }, "-max-retries 101 is outside 1..100"},
		{"poll interval too short", func(c *module.Config) { c.RelayPollInterval = time.Microsecond }, "-relay-poll-interval 1µs is outside 1ms..10m"},
		{"poll interval too long", func(c *module.Config) { c.RelayPollInterval = time.Hour }, "-relay-poll-interval 1h is outside 1ms..10m"},
		{"negative poll interval", func(c *module.Config) { c.RelayPollInterval = -time.Second }, "must not be negative"},
		{"lease timeout", func(c *module.Config) { c.RelayLeaseTimeout = 500 * time.Millisecond }, "-relay-lease-timeout 500ms is outside 1s..10m"},
		{"stuck after", func(c *module.Config) { c.StuckAfter = 1000 * time.Hour }, "-stuck-after 1000h is outside 1s..720h"},
		{"outage unready after", func(c *module.Config) { c.OutageUnreadyAfter = 2 * time.Hour }, "-outage-unready-after 2h is outside 1s..1h"},
		{"dedup window", func(c *module.Config) { c.Retention.DedupWindow = 30 * time.Second }, "-dedup-window 30s is outside 1m..87600h"},
		{"retention interval", func(c *module.Config) { c.Retention.Interval = time.Millisecond }, "-retention-interval 1ms is outside 1s..720h"},
		{"pool", func(c *module.Config) { c.MaxDBConns = 300000 }, "-db-max-conns 300000 is outside 1..262143"},
		{"negative pool", func(c *module.Config) { c.MaxDBConns = -1 }, "-db-max-conns -1 must not be negative"},
		{"shutdown timeout", func(c *module.Config) { c.ShutdownTimeout = 2 * time.Hour }, "ShutdownTimeout 2h is outside 1ms..1h"},
		{"retention batch", func(c *module.Config) { c.Retention.BatchSize = 1 << 20 }, "Retention.BatchSize 1048576 is outside 1..100000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := valid
			tc.change(&c)
			err := c.Validate(set)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestMain_FlagLimits runs Main with numeric flags and variables out of
// range: each is refused, by name and with its range, before anything
// starts. The database is a real one and stays empty; the broker is a
// closed port, which Main would report had it got that far.
func TestMain_FlagLimits(t *testing.T) {
	db := testdb.New(t)
	cmd := module.Command{Name: "accounts", Set: module.Set{accounts(), orders.Module()}, Run: []string{"accounts"}, HTTPAddr: "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"prefetch past 16 bits", []string{"-prefetch", "70000"}, nil, 1, "-prefetch 70000 is outside 1..65535"},
		{"prefetch 0", []string{"-prefetch", "0"}, nil, 1, "-prefetch 0 is outside 1..65535"},
		{"malformed lease timeout in the environment", nil, map[string]string{"RELAY_LEASE_TIMEOUT": "soon"}, 1, `RELAY_LEASE_TIMEOUT: want a duration such as 250ms or 1m30s, got "soon"`},
		{"prefetch past int64", []string{"-prefetch", "99999999999999999999"}, nil, 2, `invalid value "99999999999999999999" for flag -prefetch`},
		{"batch 0", []string{"-batch", "0"}, nil, 1, "-batch 0 is outside 1..65535"},
		{"transactions 0", []string{"-transactions", "0"}, nil, 1, "-transactions 0 is outside 1..65535"},
		{"batch above the prefetch", []string{"-batch", "65", "-prefetch", "64"}, nil, 1, "batches of 65 cannot fill with a prefetch of 64"},
		{"max retries 0", []string{"-max-retries", "0"}, nil, 1, "-max-retries 0 is outside 1..100"},
		{"database pool 0", []string{"-db-max-conns", "0"}, nil, 1, "-db-max-conns 0 is outside 1..262143"},
		{"database pool from the environment", nil, map[string]string{"DB_MAX_CONNS": "300000"}, 1, "-db-max-conns 300000 is outside 1..262143"},
		{"malformed database pool in the environment", nil, map[string]string{"DB_MAX_CONNS": "many"}, 1, `DB_MAX_CONNS: want a whole number, got "many"`},
		{"pack events 0", []string{"-relay-pack-events", "0"}, nil, 1, "-relay-pack-events 0 is outside 1..10000"},
		{"pack events from the environment", nil, map[string]string{"RELAY_PACK_EVENTS": "20000"}, 1, "-relay-pack-events 20000 is outside 1..10000"},
		{"malformed pack events in the environment", nil, map[string]string{"RELAY_PACK_EVENTS": "all"}, 1, `RELAY_PACK_EVENTS: want a whole number, got "all"`},
		{"unknown wire format", []string{"-wire-format", "compact"}, nil, 2, `unknown wire format "compact" (want standard, lean or packed)`},
		{"unknown wire format of a module", []string{"-orders-wire-format", "Packed"}, nil, 2, `unknown wire format "Packed"`},
		{"unknown wire format in the environment", nil, map[string]string{"WIRE_FORMAT": "json"}, 1, `WIRE_FORMAT: unknown wire format "json"`},
		{"unknown wire format of a module in the environment", nil, map[string]string{"ORDERS_WIRE_FORMAT": "x"}, 1, `ORDERS_WIRE_FORMAT: unknown wire format "x"`},
		{"max retries 1000", []string{"-max-retries", "1000"}, nil, 1, "-max-retries 1000 is outside 1..100"},
		{"poll interval 0", []string{"-relay-poll-interval", "0s"}, nil, 1, "-relay-poll-interval 0s is outside 1ms..10m"},
		{"poll interval from the environment", nil, map[string]string{"RELAY_POLL_INTERVAL": "24h"}, 1, "-relay-poll-interval 24h is outside 1ms..10m"},
		{"lease timeout", []string{"-relay-lease-timeout", "0s"}, nil, 1, "-relay-lease-timeout 0s is outside 1s..10m"},
		{"read interval 0", []string{"-relay-read-interval", "0s"}, nil, 1, "-relay-read-interval 0s is outside 1ms..1s"},
		{"read interval from the environment", nil, map[string]string{"RELAY_READ_INTERVAL": "2s"}, 1, "-relay-read-interval 2s is outside 1ms..1s"},
		{"malformed read interval in the environment", nil, map[string]string{"RELAY_READ_INTERVAL": "fast"}, 1, `RELAY_READ_INTERVAL: want a duration such as 250ms or 1m30s, got "fast"`},
		{"stuck after 0", []string{"-stuck-after", "0s"}, nil, 1, "-stuck-after 0s is outside 1s..720h"},
		{"stuck after from the environment", nil, map[string]string{"STUCK_AFTER": "-5m"}, 1, "-stuck-after -5m must not be negative"},
		{"outbox retention 0", []string{"-outbox-retention", "0s"}, nil, 1, "-outbox-retention 0s is outside 1m..87600h"},
		{"dedup window past ten years", []string{"-dedup-window", "100000h"}, nil, 1, "-dedup-window 100000h is outside 1m..87600h"},
		{"retention interval 0", []string{"-retention-interval", "0s"}, nil, 1, "-retention-interval 0s is outside 1s..720h"},
		{"duration past int64", []string{"-stuck-after", "300000000h"}, nil, 2, `invalid value "300000000h" for flag -stuck-after`},
		{"idempotency key window", []string{"-idempotency-key-window", "1s"}, nil, 2, "-idempotency-key-window: idempotency key window 1s: want between 1m0s and 720h0m0s"},
		{"idempotency key window from the environment", nil, map[string]string{orders.WindowEnv: "1000h"}, 1, "IDEMPOTENCY_KEY_WINDOW: idempotency key window 1000h0m0s: want between"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"RELAY_POLL_INTERVAL", "STUCK_AFTER", "RELAY_LEASE_TIMEOUT", "OUTBOX_RETENTION", "DEDUP_WINDOW", "RETENTION_INTERVAL", "DB_MAX_CONNS", "RELAY_PACK_EVENTS", "RELAY_READ_INTERVAL", "WIRE_FORMAT", "ORDERS_WIRE_FORMAT",
				orders.WindowEnv, "MODULES", "OUTBOXMILL_NAMESPACE", "ACCOUNTS_DATABASE_URL", "ORDERS_DATABASE_URL"} {
				t.Setenv(k, "")
			}
			t.Setenv("DATABASE_URL", db.URL)
			t.Setenv("AMQP_URL", clitest.UnreachableBroker)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			code := module.Main(cmd, tc.args, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want %d with %q; stderr:\n%s", code, tc.code, tc.want, stderr.String())
			}
			if strings.Contains(stderr.String(), "connect to") {
				t.Errorf("Main went on to connect:\n%s", stderr.String())
			}
			if n := db.Count(t, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`); n != 0 {
				t.Fatalf("%d tables in the database: Main started", n)
			}
		})
	}
}

func TestConfig_Validate_PoolLeavesRoomBesideTheRelays(t *testing.T) {
	t.Parallel()
	type ledgerClosed struct{}
	set := module.Set{accounts(), {Name: "ledger", Publishes: []domain.EventType{domain.Declare[ledgerClosed]("LedgerClosed", 1)}}}
	base := module.Config{Run: []string{"accounts", "ledger"}, DatabaseURL: "postgres://db/one", AMQPURL: "amqp://broker/"}
	for _, tc := range []struct {
		name  string
		edit  func(*module.Config)
		valid bool
	}{
		{"two relays with notifications in 6", func(c *module.Config) { c.MaxDBConns = 6 }, true},
		{"two relays with notifications in 5", func(c *module.Config) { c.MaxDBConns = 5 }, false},
		{"without notifications 4 do", func(c *module.Config) { off := false; c.RelayNotify = &off; c.MaxDBConns = 4 }, true},
		{"without relays 1 does", func(c *module.Config) { off := false; c.Relay = &off; c.MaxDBConns = 1 }, true},
		{"a database each", func(c *module.Config) {
			c.DatabaseURLs = map[string]string{"ledger": "postgres://db/two"}
			c.MaxDBConns = 4
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			err := c.Validate(set)
			if (err == nil) != tc.valid {
				t.Fatalf("Validate() = %v, want valid=%v", err, tc.valid)
			}
			if err != nil && !strings.Contains(err.Error(), "too small for modules accounts, ledger") {
				t.Errorf("error %q does not name the modules sharing the pool", err)
			}
		})
	}
}
