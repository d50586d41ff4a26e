package module

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
)

// Module is one slice of an application: its tables, the events it
// publishes, the handlers it runs and its HTTP routes. A module never wires
// infrastructure itself: the process that runs it (Run, Main) opens its
// database, migrates the framework's tables and the module's, runs the relay
// of its outbox, its handlers behind the whole safe chain, and serves its
// routes beside the other modules'.
type Module struct {
	// Name names the module: its outbox ("<Name>_outbox"), its migration
	// history ("<Name>_schema_migrations"), its database setting
	// (-<name>-database-url, env <NAME>_DATABASE_URL). 1 to MaxNameLen of
	// a-z, 0-9 and _, starting with a letter. Required.
	Name string
	// Migrations are the module's own tables' migrations (*.sql, applied
	// in name order, each once).
	Migrations fs.FS
	// Publishes declares the events the module writes to its outbox. A
	// module that publishes has an outbox and a relay.
	Publishes []domain.EventType
	// Consumes declares other modules' events its handlers decode.
	Consumes []domain.EventType
	// Handlers are the module's consumer handlers.
	Handlers []consumer.Handler
	// Routes, when set, adds the module's HTTP routes to mux, with the
	// module's runtime (its database, unit of work, logger).
	Routes func(rt Runtime, mux *http.ServeMux) error
	// Flags, when set, defines the module's own settings on the flag set
	// of a command over the set (Main, outboxctl purge) before it parses
	// its command line; Routes and Retention see the parsed values. Flag
	// names must not clash with the command's or another module's.
	Flags func(fs *flag.FlagSet) error
	// Retention, when set, returns the module's own retention rules (rows
	// of its tables to purge in batches, such as expired idempotency keys):
	// a process running the module purges them on the retention interval
	// beside the framework's tables, and outboxctl purge purges them too.
	Retention func() []retention.Rule
	// Reconcile are the module's checks of its own effects against the
	// events that caused them, which outboxctl reconcile runs against the
	// outbox of the module publishing each check's event type.
	Reconcile []reconcile.Check
}

// Runtime is what a module's routes get from the process running it.
type Runtime struct {
	// DB is the module's database (a pool shared with the process's other
	// modules on the same database).
	DB *sqlx.DB
	// UnitOfWork commits a change and the events it returns to the module's
	// outbox; nil when the module publishes nothing.
	UnitOfWork *postgres.UnitOfWork
	// Registry holds every event type of the process.
	Registry *domain.Registry
	// Metrics registers the module's own metrics beside the framework's.
	Metrics prometheus.Registerer
	// Logger receives the module's logs.
	Logger *slog.Logger
}

// MaxNameLen is the longest module name: the longest PostgreSQL names made
// from it, its outbox's offsets table "watermill_offsets_<name>_outbox" and
// its relay's notification channel "outboxmill_outbox_<name>_outbox", must
// fit in an identifier (63 bytes). The server would cut a longer table
// name and refuse a longer channel.
const MaxNameLen = 38

// Outbox returns the module's outbox.
func (m Module) Outbox() outbox.Config { return outbox.ForModule(m.Name) }

// Validate checks the module's declaration.
func (m Module) Validate() error {
	var errs []error
	if m.Name == "" || m.Name[0] < 'a' || m.Name[0] > 'z' || len(m.Name) > MaxNameLen ||
		strings.IndexFunc(m.Name, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') }) >= 0 {
		errs = append(errs, fmt.Errorf("module name %q: want 1 to %d of a-z, 0-9 and _, starting with a letter", m.Name, MaxNameLen))
	}
	if m.Name == postgres.FrameworkOwner {
		errs = append(errs, fmt.Errorf("module name %q is the framework's", m.Name))
	}
	reg, err := m.registry()
	if err != nil {
		errs = append(errs, fmt.Errorf("module %s: %w", m.Name, err))
	}
	for _, c := range m.Reconcile {
		if err := c.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("module %s: %w", m.Name, err))
		} else if reg != nil && !declared(reg, c.EventType) {
			errs = append(errs, fmt.Errorf("module %s: reconcile check %q: event type %s is not declared (list it in Consumes or Publishes)", m.Name, c.Name, c.EventType))
		}
	}
	return errors.Join(errs...)
}

func declared(reg *domain.Registry, eventType string) bool {
	_, ok := reg.Lookup(eventType)
	return ok
}

func (m Module) registry() (*domain.Registry, error) {
	return domain.NewRegistry(append(slices.Clone(m.Publishes), m.Consumes...)...)
}

// Set is every module of an application, whether or not a process runs
// it: every process declares the whole broker topology up front, so that
// an event published before its consumer ever ran waits in the consumer's
// queue.
type Set []Module

// Validate checks each module and what they must agree on: unique names,
// unique handler names, every handler's events declared, one declaration
// per event type.
func (s Set) Validate() error {
	var errs []error
	names, handlers := map[string]bool{}, map[string]string{}
	for _, m := range s {
		if err := m.Validate(); err != nil {
			errs = append(errs, err)
		}
		if names[m.Name] {
			errs = append(errs, fmt.Errorf("module %s listed twice", m.Name))
		}
		names[m.Name] = true
		for _, h := range m.Handlers {
			if other, ok := handlers[h.Name]; ok {
				errs = append(errs, fmt.Errorf("handler %s of module %s: the name is taken by module %s", h.Name, m.Name, other))
			}
			handlers[h.Name] = m.Name
		}
	}
	if _, err := s.Registry(); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, m := range s {
		// Against the module's own declarations: a handler of an event its
		// module does not list would work beside the event's publisher and
		// fail in a process without it.
		own, err := m.registry()
		if err != nil {
			continue // reported by m.Validate
		}
		for _, h := range m.Handlers {
			if err := h.Validate(own); err != nil {
				errs = append(errs, fmt.Errorf("module %s (list consumed events in Consumes): %w", m.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Registry returns the registry of every event type the modules declare.
func (s Set) Registry() (*domain.Registry, error) {
	var types []domain.EventType
	for _, m := range s {
		types = append(append(types, m.Publishes...), m.Consumes...)
	}
	return domain.NewRegistry(types...)
}

// Find returns the module named name.
func (s Set) Find(name string) (Module, bool) {
	i := slices.IndexFunc(s, func(m Module) bool { return m.Name == name })
	if i < 0 {
		return Module{}, false
	}
	return s[i], true
}

// Publisher returns the module that publishes eventType.
func (s Set) Publisher(eventType string) (Module, bool) {
	for _, m := range s {
		if slices.ContainsFunc(m.Publishes, func(t domain.EventType) bool { return t.Name == eventType }) {
			return m, true
		}
	}
	return Module{}, false
}

// Names derives the broker object names of one deployment from its
// namespace, so that several deployments (or tests) can share one virtual
// host.
type Names struct {
	Namespace string
}

// DefaultNamespace prefixes the broker objects unless configured otherwise.
const DefaultNamespace = "outboxmill"

// ValidateNamespace checks that ns is usable in exchange and queue names:
// at most 100 of a-z, A-Z, 0-9, '-', '_' and '.', and neither "amq" nor
// starting with "amq.", since every name made from it starts with ns and
// a dot, and RabbitMQ refuses to declare names starting with "amq.".
func ValidateNamespace(ns string) error {
	if ns == "" {
		return errors.New("empty namespace")
	}
	if len(ns) > 100 || strings.IndexFunc(ns, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0 {
		return errors.New("namespace may hold at most 100 of a-z, A-Z, 0-9, '-', '_' and '.'")
	}
	if ns == "amq" || strings.HasPrefix(ns, "amq.") {
		return fmt.Errorf("namespace %q: RabbitMQ reserves the names starting with \"amq.\"", ns)
	}
	return nil
}

// Exchange is the topic exchange the module named publishes its events to:
// "<namespace>.<module>.events". One exchange per publishing module lets a
// broker user be allowed to publish there and nowhere else.
func (n Names) Exchange(module string) string { return n.Namespace + "." + module + ".events" }

// Unroutable is the queue that collects events no other queue is bound to
// (through the events exchanges' alternate exchange, named alike).
func (n Names) Unroutable() string { return n.Namespace + ".unroutable" }

// Queue is the queue of lane lane of the handler named handler.
func (n Names) Queue(handler string, lane int) string {
	return n.Namespace + "." + handler + "." + strconv.Itoa(lane)
}

// Queues returns the lane queues of h.
func (n Names) Queues(h consumer.Handler) []string {
	lanes := max(h.Lanes, 1)
	queues := make([]string, lanes)
	for lane := range queues {
		queues[lane] = n.Queue(h.Name, lane)
	}
	return queues
}

// Route is one consumer handler of the set: the event types routed to it and
// the queues it reads them from. Reconcile compares each route's processed
// events with the outbox of the module publishing them.
type Route struct {
	// Module is the handler's module.
	Module string
	// Handler is the handler's name.
	Handler string
	// EventTypes are the event types routed to the handler.
	EventTypes []string
	// Queues are the handler's lane queues. Queue i is bound to the routing
	// keys of EventTypes for the outbox shards s with s % len(Queues) == i.
	Queues []string
}

// Routes lists every consumer handler of the set.
func (s Set) Routes(n Names) ([]Route, error) {
	reg, err := s.Registry()
	if err != nil {
		return nil, err
	}
	var routes []Route
	for _, m := range s {
		for _, h := range m.Handlers {
			types, err := h.EventTypes(reg)
			if err != nil {
				return nil, err
			}
			routes = append(routes, Route{Module: m.Name, Handler: h.Name, EventTypes: types, Queues: n.Queues(h)})
		}
	}
	return routes, nil
}

// Topology is the whole broker topology of the set: the events exchange of
// every publishing module; every handler's lane queues, each with a single
// active consumer so that several instances share the lanes without
// reordering them, bound on the exchange of each event's publisher to the
// routing keys of its events' shards; and the unroutable queue behind the
// exchanges' alternate exchange. queueType (rabbitmq.QueueClassic or
// QueueQuorum) is the type of every queue, the unroutable one included.
func (s Set) Topology(n Names, queueType string) (rabbitmq.Topology, error) {
	routes, err := s.Routes(n)
	if err != nil {
		return rabbitmq.Topology{}, err
	}
	t := rabbitmq.Topology{UnroutableQueue: n.Unroutable(), UnroutableType: queueType}
	for _, m := range s {
		if len(m.Publishes) > 0 {
			t.Exchanges = append(t.Exchanges, n.Exchange(m.Name))
		}
	}
	for _, r := range routes {
		for lane, queue := range r.Queues {
			var bindings []rabbitmq.Binding
			for _, eventType := range r.EventTypes {
				publisher, ok := s.Publisher(eventType)
				if !ok {
					return rabbitmq.Topology{}, fmt.Errorf("handler %s: no module of the set publishes %s", r.Handler, eventType)
				}
				for shard := lane; shard < outbox.Shards; shard += len(r.Queues) {
					bindings = append(bindings, rabbitmq.Binding{Exchange: n.Exchange(publisher.Name), RoutingKey: eventType + "." + strconv.Itoa(shard)})
				}
			}
			t.Queues = append(t.Queues, rabbitmq.Queue{
				Name:                 queue,
				Bindings:             bindings,
				Type:                 queueType,
				SingleActiveConsumer: true,
			})
		}
	}
	return t, nil
}
