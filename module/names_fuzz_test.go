package module_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
)

// Limits of the names the broker and the database are given.
const (
	// maxAMQPName is the longest exchange or queue name (an AMQP short
	// string).
	maxAMQPName = 255
	// maxIdentifier is the longest PostgreSQL identifier (NAMEDATALEN - 1):
	// the server cuts a longer table name, and refuses a longer
	// notification channel ("channel name too long").
	maxIdentifier = 63
)

// FuzzValidateNamespace checks that every namespace ValidateNamespace
// accepts makes broker names that RabbitMQ takes: exchanges and queues of
// at most 255 bytes, printable ASCII, and outside the prefix "amq." that
// RabbitMQ keeps for itself (it refuses to declare them, ACCESS_REFUSED).
func FuzzValidateNamespace(f *testing.F) {
	for _, ns := range []string{
		module.DefaultNamespace, "acme-prod.eu_1", "a", ".", "..", "amq", "amq.", "amq.prod", "AMQ.prod", "amqp", "xamq.",
		strings.Repeat("n", 100), strings.Repeat("n", 101), "", "ns/with/slash", "ns with space", "né", "ns\x00", "ns\n",
	} {
		f.Add(ns)
	}
	f.Fuzz(func(t *testing.T, ns string) {
		if module.ValidateNamespace(ns) != nil {
			return
		}
		n := module.Names{Namespace: ns}
		// The longest names the namespace goes into: a module's exchange
		// and a handler's last lane.
		for _, name := range []string{
			n.Exchange(strings.Repeat("m", 38)), n.Unroutable(),
			n.Queue("h"+strings.Repeat(".", 99), outbox.Shards-1),
		} {
			if len(name) > maxAMQPName {
				t.Fatalf("namespace %q makes the name %q of %d bytes; AMQP carries at most %d", ns, name, len(name), maxAMQPName)
			}
			if strings.HasPrefix(name, "amq.") {
				t.Fatalf("namespace %q makes the name %q, which RabbitMQ reserves", ns, name)
			}
			for _, c := range []byte(name) {
				if c <= ' ' || c >= 0x7f {
					t.Fatalf("namespace %q makes the name %q with byte %#x", ns, name, c)
				}
			}
		}
	})
}

// FuzzModule_Name checks that every module name Module.Validate accepts
// makes PostgreSQL names that fit in an identifier as they are (a longer
// table name is cut, which two modules could then share, and a longer
// notification channel is refused, so the relay's wake-ups would be lost):
// its outbox and offsets tables, its migration history, its relay's
// notification channel; and that the outbox is valid.
func FuzzModule_Name(f *testing.F) {
	for _, name := range []string{
		"orders", "settlement", "a", "a_1", strings.Repeat("m", 38), strings.Repeat("m", 39), strings.Repeat("m", 40),
		"", "1orders", "_orders", "Orders", "or-ders", "or.ders", "ordérs", "orders\x00",
	} {
		f.Add(name)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if (module.Module{Name: name}).Validate() != nil {
			return
		}
		box := (module.Module{Name: name}).Outbox()
		if err := box.Validate(); err != nil {
			t.Fatalf("module %q: %v", name, err)
		}
		for _, ident := range []string{
			unquote(box.Table()), unquote(box.OffsetsTable()), name + "_schema_migrations",
			// The notification channel of the module's relay, as the
			// process names it.
			relay.DefaultNotifyChannel + "_" + box.Topic,
		} {
			if len(ident) > maxIdentifier {
				t.Fatalf("module %q makes the PostgreSQL name %q of %d bytes, more than %d", name, ident, len(ident), maxIdentifier)
			}
		}
	})
}

// unquote returns a quoted identifier's name.
func unquote(ident string) string {
	return strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(ident, `"`), `"`), `""`, `"`)
}

// TestValidateNamespace_TheBrokersLimits checks the rules of
// ValidateNamespace against RabbitMQ: it declares the longest names of the
// longest namespace, and is refused the names of the namespaces refused
// for the reserved prefix.
func TestValidateNamespace_TheBrokersLimits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := rabbitmq.Dial(ctx, testenv.FromEnvironment().AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	declare := func(name string) error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		if err := ch.ExchangeDeclare(name, "topic", false, true, false, false, nil); err != nil {
			return err
		}
		if _, err := ch.QueueDeclare(name, false, true, false, false, nil); err != nil {
			return err
		}
		_, _ = ch.QueueDelete(name, false, false, false)
		return ch.ExchangeDelete(name, false, false)
	}

	longest := testenv.UniqueName("obm_test_")
	longest += strings.Repeat("n", 100-len(longest))
	if err := module.ValidateNamespace(longest); err != nil {
		t.Fatal(err)
	}
	n := module.Names{Namespace: longest}
	for _, name := range []string{n.Exchange(strings.Repeat("m", module.MaxNameLen)), n.Queue("h"+strings.Repeat("x", 99), outbox.Shards-1)} {
		if err := declare(name); err != nil {
			t.Fatalf("declare %s (%d bytes): %v", name, len(name), err)
		}
	}
	for _, ns := range []string{"amq", "amq.prod"} {
		if module.ValidateNamespace(ns) == nil {
			t.Errorf("namespace %q accepted", ns)
		}
		err := declare(module.Names{Namespace: ns}.Unroutable())
		var amqpErr *amqp.Error
		if !errors.As(err, &amqpErr) || amqpErr.Code != amqp.AccessRefused {
			t.Errorf("namespace %q: declare gave %v, want the broker's ACCESS_REFUSED", ns, err)
		}
	}
}

// TestMaxNameLen_PostgreSQLsLimits checks MaxNameLen against PostgreSQL: a
// module of the longest name gets its outbox tables under their full names
// and can notify its relay, and one byte more would lose both.
func TestMaxNameLen_PostgreSQLsLimits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testdb.New(t)
	longest := module.Module{Name: strings.Repeat("m", module.MaxNameLen)}
	if err := longest.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (module.Module{Name: longest.Name + "m"}).Validate(); err == nil {
		t.Fatalf("module name of %d bytes accepted", module.MaxNameLen+1)
	}
	box := longest.Outbox()
	if err := outbox.Initialize(ctx, db.DB, box); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{box.Table(), box.OffsetsTable()} {
		var n int
		if err := db.GetContext(ctx, &n, `SELECT count(*) FROM pg_class WHERE relname = $1`, unquote(table)); err != nil || n != 1 {
			t.Errorf("table %s: %d under its full name (%v), want 1", table, n, err)
		}
	}
	channel := relay.DefaultNotifyChannel + "_" + box.Topic
	if _, err := db.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel); err != nil {
		t.Errorf("notify on %s: %v", channel, err)
	}
	if _, err := db.ExecContext(ctx, `SELECT pg_notify($1, '')`, channel+"x"); err == nil {
		t.Errorf("notify on a channel of %d bytes worked; MaxNameLen could be larger", len(channel)+1)
	}
}
