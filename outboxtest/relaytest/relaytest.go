package relaytest

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/adapters/relay"
	"github.com/outboxmill/outboxmill/domain"
)

// Kind is one relay implementation under the contract: a name, what it
// guarantees beyond what every kind must, and how to build one.
type Kind struct {
	// Name names the kind in logs and failure messages. Required.
	Name string
	// Features says what the kind guarantees beyond the contract every kind
	// keeps; it decides which properties run and how strict they are.
	Features Features
	// New builds a relay of this kind for a test. Required.
	New Factory
	// Peers are other kinds that read and store the same position as this
	// one, so that either can take over from the other: the handover
	// property switches from this kind to each peer and back in the middle
	// of a stream. Leave it empty for a kind that keeps a position of its
	// own; the handover property then does not run.
	Peers []Kind
}

// Factory returns a relay of one kind over env's outbox, not running yet:
// the suite calls Run, then Close (or cuts its connections first, as a
// crash would). It is called once per relay instance, with an Env of that
// instance. Resources that Close does not release are released through
// t.Cleanup.
type Factory func(t testing.TB, env Env) (relay.Relay, error)

// Features are the guarantees that not every relay kind gives.
type Features struct {
	// SingleActive reports that the kind keeps one active instance per
	// outbox and consumer group, the others standing by: with two
	// instances running on one outbox and no fault, no event is published
	// twice, and when the active one dies the standby takes over.
	SingleActive bool
	// SetsAsideInvalidRows reports that a row that is not a valid forwarder
	// envelope is recorded in outbox_set_aside (kind relay.AsideInvalid) and
	// the rows after it are published; without it the property does not
	// run.
	SetsAsideInvalidRows bool
	// ReportsPositionRegressions reports that the kind keeps its position
	// in the outbox's offsets table (Env.ConsumerGroup) and, when it finds
	// that position gone or behind the one it last loaded or stored,
	// publishes the rows after the position it found again and reports one
	// regression of kind relay.PositionMissing or relay.PositionBackwards
	// to Env.Metrics (relay.PositionMetrics); without it the property does
	// not run.
	ReportsPositionRegressions bool
	// MaxResent bounds the events delivered twice after an interruption
	// of one instance (a crash, a stop, a cut broker connection, a switch
	// to another kind): those it had published and whose position it had
	// not stored yet, at the pace of the suite's streams (a few hundred
	// events a second). It is what the kind has in flight: for example
	// its window of rows read ahead of the stored position, or the rows of
	// a batch whose position is stored once the batch is done. The suite
	// delivers half as many more before each fault, so that a relay that
	// forgot its position is caught. Required.
	MaxResent int
}

// Env is what a relay instance gets from the suite: a database of the
// test's own, with the framework's tables and the outbox, and a broker
// namespace of its own with its topology declared. Every connection the
// relay opens must use DB, DatabaseURL and AMQPURL, which go through
// proxies of this instance: the suite cuts them to cut the broker or to
// stop the instance abruptly.
type Env struct {
	// DB is a pool of this instance on the test's database, at most 4
	// connections; the suite closes it after the relay.
	DB *sqlx.DB
	// DatabaseURL is the test's database, through this instance's proxy,
	// for a kind that opens connections of its own (a replication
	// connection, a LISTEN session).
	DatabaseURL string
	// Outbox is the outbox to relay.
	Outbox outbox.Config
	// ConsumerGroup names the relay's position in the outbox's offsets
	// table, for kinds that keep it there.
	ConsumerGroup string
	// Registry is the registry of the events the suite commits.
	Registry *domain.Registry
	// AMQPURL is the broker, through this instance's proxy.
	AMQPURL string
	// Exchange is the durable topic exchange events are published to,
	// with the routing key of each row's destination topic.
	Exchange string
	// Topology is the namespace's exchange and queues, declared before the
	// relay starts: a kind must not declare it again. Every routing key the
	// suite uses reaches one of its queues.
	Topology rabbitmq.Topology
	// Logger writes to the test's log.
	Logger *slog.Logger
	// Metrics receives what the relay reports, for a kind that reports
	// through relay.Metrics (its Config.Metrics); it implements
	// relay.PositionMetrics too. It is shared by the relay instances of
	// one property.
	Metrics relay.Metrics
}

// validate checks that k can be run.
func (k Kind) validate() error {
	var errs []error
	if k.Name == "" {
		errs = append(errs, errors.New("relaytest: kind without a name"))
	}
	if k.New == nil {
		errs = append(errs, errors.New("relaytest: kind "+k.Name+" without a factory"))
	}
	if k.Features.MaxResent < 1 {
		errs = append(errs, errors.New("relaytest: kind "+k.Name+" needs Features.MaxResent of at least 1"))
	}
	for _, p := range k.Peers {
		if p.New == nil || p.Features.MaxResent < 1 {
			errs = append(errs, errors.New("relaytest: peer "+p.Name+" of kind "+k.Name+" needs a factory and Features.MaxResent"))
		}
	}
	return errors.Join(errs...)
}

// property is one guarantee of the contract, checked by a subtest.
type property struct {
	name string
	run  func(t *testing.T, k Kind)
	// when, if set, reports whether the property applies to the kind.
	when func(k Kind) bool
}

// properties are the contract, in the order they run.
var properties = []property{
	{name: "PublishesEveryCommittedEventWithConfirms", run: testPublishesEveryCommittedEvent},
	{name: "PublishesTheStandardWireFormat", run: testStandardWireFormat},
	{name: "KeepsAggregateOrderOnLanes", run: testKeepsAggregateOrder},
	{name: "NeverPublishesRolledBackEvents", run: testNeverPublishesRolledBack},
	{name: "DoesNotSkipATransactionCommittedLate", run: testDoesNotSkipLateCommit},
	{name: "DrainsABacklogWrittenBeforeItStarts", run: testDrainsBacklog},
	{name: "StoppedAbruptlyLosesNothing", run: testStoppedAbruptly},
	{name: "TwoRelaysOnOneOutbox", run: testTwoRelays},
	{name: "BrokerConnectionCutLosesNothing", run: testBrokerCut},
	{name: "ClosedAsTheBrokerDropsStops", run: testClosedAsBrokerDrops},
	{name: "SetsAsideAnInvalidRow", run: testSetsAsideInvalidRow,
		when: func(k Kind) bool { return k.Features.SetsAsideInvalidRows }},
	{name: "ReportsAPositionThatRegresses", run: testReportsPositionRegressions,
		when: func(k Kind) bool { return k.Features.ReportsPositionRegressions }},
	{name: "HandsOverToAnotherKind", run: testHandover,
		when: func(k Kind) bool { return len(k.Peers) > 0 }},
}

// Run checks that relays of kind keep the relay contract, one subtest per
// property, each in parallel with the others, each against the real
// servers (testenv's: OUTBOXMILL_ADMIN_DATABASE_URL and AMQP_URL, by
// default the local services) with a database and a broker namespace of
// its own. Properties a kind's Features do not claim are not run.
func Run(t *testing.T, kind Kind) {
	t.Helper()
	if err := kind.validate(); err != nil {
		t.Fatal(err)
	}
	for _, p := range properties {
		if p.when != nil && !p.when(kind) {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			p.run(t, kind)
		})
	}
}
