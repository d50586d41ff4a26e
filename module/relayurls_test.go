package module_test

import (
	"strings"
	"testing"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/module"
)

// TestConfig_Validate_RelayURLs checks the relays' own database URLs: only
// for modules of the set, and a pool of relays alone sized for the
// sessions they hold plus one for their reads. That the relays do use them
// is shown by outboxtest's KillRelay tests, which cut those connections
// alone.
func TestConfig_Validate_RelayURLs(t *testing.T) {
	t.Parallel()
	type ledgerClosed struct{}
	set := module.Set{accounts(), {Name: "ledger", Publishes: []domain.EventType{domain.Declare[ledgerClosed]("LedgerClosed", 1)}}}
	base := module.Config{Run: []string{"accounts", "ledger"}, DatabaseURL: "postgres://db/one", AMQPURL: "amqp://broker/",
		RelayAMQPURL: "amqp://relay-path/"}
	relays := map[string]string{"accounts": "postgres://proxy/one", "ledger": "postgres://proxy/one"}
	for _, tc := range []struct {
		name string
		edit func(*module.Config)
		want string // "" for valid
	}{
		{"relays apart, with notifications, in 5", func(c *module.Config) { c.RelayDatabaseURLs = relays; c.MaxDBConns = 5 }, ""},
		{"relays apart, with notifications, in 4", func(c *module.Config) { c.RelayDatabaseURLs = relays; c.MaxDBConns = 4 },
			"too small for the relays of modules accounts, ledger on their relay database URL: they hold 4"},
		{"relays apart leave the modules' pool 2", func(c *module.Config) {
			off := false
			c.RelayNotify = &off
			c.RelayDatabaseURLs = relays
			c.MaxDBConns = 3
		}, ""},
		{"one relay apart", func(c *module.Config) {
			off := false
			c.RelayNotify = &off
			c.RelayDatabaseURLs = map[string]string{"ledger": "postgres://proxy/one"}
			c.MaxDBConns = 2
		}, "too small for modules accounts on one database"},
		{"a relay URL that is the modules' own", func(c *module.Config) {
			c.RelayDatabaseURLs = map[string]string{"ledger": "postgres://db/one"}
			c.MaxDBConns = 5
		}, "too small for modules accounts, ledger on one database"},
		{"unknown module", func(c *module.Config) { c.RelayDatabaseURLs = map[string]string{"nope": "postgres://x"} },
			`relay database URL for unknown module "nope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base
			tc.edit(&c)
			err := c.Validate(set)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
