package module_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/module"
)

type opened struct {
	Owner string `json:"owner"`
}

type closed struct {
	Reason string `json:"reason"`
}

var (
	openedType = domain.Declare[opened]("AccountOpened", 1)
	closedType = domain.Declare[closed]("AccountClosed", 1)
)

func noop[T any](context.Context, postgres.Tx, consumer.Event[T]) ([]domain.Event, error) {
	return nil, nil
}

func accounts() module.Module {
	return module.Module{Name: "accounts", Publishes: []domain.EventType{openedType, closedType}}
}

func audit(handlers ...consumer.Handler) module.Module {
	return module.Module{Name: "audit", Consumes: []domain.EventType{openedType, closedType}, Handlers: handlers}
}

func TestSet_Validate(t *testing.T) {
	t.Parallel()
	h := consumer.Handler{Name: "audit.log", Cases: []consumer.Case{consumer.On(noop[opened])}}
	for _, tc := range []struct {
		name string
		set  module.Set
		want string // "" for valid
	}{
		{"valid", module.Set{accounts(), audit(h)}, ""},
		{"module listed twice", module.Set{accounts(), accounts()}, "listed twice"},
		{"bad module name", module.Set{{Name: "Accounts"}}, "module name"},
		{"the framework's name", module.Set{{Name: "outboxmill"}}, "framework"},
		{"handler name taken", module.Set{audit(h), {Name: "audit2", Consumes: []domain.EventType{openedType}, Handlers: []consumer.Handler{h}}}, "taken"},
		{"handler of an undeclared event", module.Set{{Name: "audit", Handlers: []consumer.Handler{h}}}, "not registered"},
		{"consumed event published in the set but not listed", module.Set{accounts(), {Name: "audit", Handlers: []consumer.Handler{h}}}, "Consumes"},
		{"one event declared two ways", module.Set{accounts(), {Name: "other", Publishes: []domain.EventType{domain.Declare[opened]("AccountOpened", 2)}}}, "declared twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.set.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestSet_Topology(t *testing.T) {
	t.Parallel()
	h := consumer.Handler{Name: "audit.log", Lanes: 4, Cases: []consumer.Case{consumer.On(noop[opened]), consumer.On(noop[closed])}}
	set := module.Set{accounts(), audit(h)}
	names := module.Names{Namespace: "ns"}
	top, err := set.Topology(names, "quorum")
	if err != nil {
		t.Fatal(err)
	}
	// One exchange per publishing module; audit publishes nothing.
	if strings.Join(top.Exchanges, ",") != "ns.accounts.events" || top.UnroutableQueue != "ns.unroutable" || top.AlternateExchange() != "ns.unroutable" {
		t.Errorf("exchanges %q, unroutable %q via %q", top.Exchanges, top.UnroutableQueue, top.AlternateExchange())
	}
	if len(top.Queues) != 4 {
		t.Fatalf("%d queues, want one per lane", len(top.Queues))
	}
	// Every routing key of both event types is bound to exactly one lane,
	// and every lane queue has a single active consumer.
	seen := map[string]string{}
	for i, q := range top.Queues {
		if q.Name != names.Queue("audit.log", i) || q.Type != "quorum" || !q.SingleActiveConsumer {
			t.Errorf("queue %d: %+v", i, q)
		}
		for _, b := range q.Bindings {
			key := b.RoutingKey
			if b.Exchange != names.Exchange("accounts") {
				t.Errorf("queue %s bound on %s, want the publisher's exchange", q.Name, b.Exchange)
			}
			if other, dup := seen[key]; dup {
				t.Errorf("key %s bound to %s and %s", key, other, q.Name)
			}
			seen[key] = q.Name
		}
	}
	if len(seen) != 2*16 {
		t.Errorf("%d routing keys bound, want 2 event types x 16 shards", len(seen))
	}
	if !top.Routes("ns.accounts.events", "AccountClosed.7") || top.Routes("ns.accounts.events", "AccountRenamed.7") || top.Routes("ns.audit.events", "AccountClosed.7") {
		t.Error("Routes disagrees with the bindings")
	}
	accountsRouter, auditRouter := top.Router("ns.accounts.events"), top.Router("ns.audit.events")
	if !accountsRouter("AccountClosed.7") || accountsRouter("AccountRenamed.7") || auditRouter("AccountClosed.7") {
		t.Error("Router disagrees with the bindings")
	}
	routes, err := set.Routes(names)
	if err != nil || len(routes) != 1 || routes[0].Module != "audit" || strings.Join(routes[0].EventTypes, ",") != "AccountOpened,AccountClosed" {
		t.Fatalf("routes %+v, %v", routes, err)
	}
	if p, ok := set.Publisher("AccountClosed"); !ok || p.Name != "accounts" {
		t.Errorf("publisher of AccountClosed: %q %v", p.Name, ok)
	}
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	set := module.Set{accounts(), audit()}
	valid := module.Config{Run: []string{"accounts"}, DatabaseURL: "postgres://x", AMQPURL: "amqp://x"}
	if err := valid.Validate(set); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*module.Config)
		want   string
	}{
		{"no module", func(c *module.Config) { c.Run = nil }, "no module to run"},
		{"unknown module", func(c *module.Config) { c.Run = []string{"billing"} }, `unknown module "billing"`},
		{"no database", func(c *module.Config) { c.DatabaseURL = "" }, "empty database URL"},
		{"database of an unknown module", func(c *module.Config) { c.DatabaseURLs = map[string]string{"billing": "x"} }, "unknown module"},
		{"bad namespace", func(c *module.Config) { c.Namespace = "a b" }, "namespace"},
		{"bad relay kind", func(c *module.Config) { c.RelayKind = "kafka" }, `relay kind "kafka"`},
		{"bad consumer", func(c *module.Config) { c.Consumer = "pull" }, `consumer "pull"`},
		{"batch above prefetch", func(c *module.Config) { c.MaxBatch, c.Prefetch = 100, 10 }, "cannot fill"},
		{"bad wire format", func(c *module.Config) { c.WireFormat = "compact" }, `unknown wire format "compact"`},
		{"wire format of an unknown module", func(c *module.Config) { c.WireFormats = map[string]rabbitmq.Format{"billing": rabbitmq.FormatLean} }, `wire format for unknown module "billing"`},
		{"wire format of a module that publishes nothing", func(c *module.Config) { c.WireFormats = map[string]rabbitmq.Format{"audit": rabbitmq.FormatLean} }, "wire format for module audit, which publishes nothing"},
		{"bad wire format of a module", func(c *module.Config) { c.WireFormats = map[string]rabbitmq.Format{"accounts": "x"} }, `module accounts: unknown wire format "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := valid
			tc.change(&c)
			if err := c.Validate(set); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestEnvDuration(t *testing.T) {
	t.Setenv("OBM_TEST_WINDOW", "90s")
	if d, err := module.EnvDuration("OBM_TEST_WINDOW", time.Minute); err != nil || d != 90*time.Second {
		t.Errorf("EnvDuration = %v, %v; want 1m30s", d, err)
	}
	t.Setenv("OBM_TEST_WINDOW", "soon")
	if _, err := module.EnvDuration("OBM_TEST_WINDOW", time.Minute); err == nil || !strings.Contains(err.Error(), "OBM_TEST_WINDOW") {
		t.Errorf("EnvDuration of a malformed value = %v, want an error naming the variable", err)
	}
	t.Setenv("OBM_TEST_WINDOW", "")
	if d, err := module.EnvDuration("OBM_TEST_WINDOW", time.Minute); err != nil || d != time.Minute {
		t.Errorf("EnvDuration of an empty variable = %v, %v; want the default", d, err)
	}
}
