// Package relaytest is the contract every relay kind must keep, as one
// suite run against each implementation (Watermill's pubsub/tests does the
// same for Publishers and Subscribers). A kind is a name, its Features and a
// Factory that builds a relay.Relay over a test's outbox; Run checks it:
//
//	func TestMyRelay_Contract(t *testing.T) {
//		relaytest.Run(t, relaytest.Kind{
//			Name:     "cdc",
//			Features: relaytest.Features{SingleActive: true, MaxResent: 64},
//			New:      newCDCRelay,
//			Peers:    []relaytest.Kind{relaytest.Outboxmill()},
//		})
//	}
//
// Each property is a subtest of its own, in parallel with the others,
// against the real PostgreSQL and RabbitMQ (testenv's servers:
// OUTBOXMILL_ADMIN_DATABASE_URL and AMQP_URL, by default the local
// services), with a fresh database (the framework's tables and one outbox)
// and a broker namespace of its own: a topic exchange and four lane queues,
// lane i bound to the shards s with s % 4 == i, so that every event of an
// aggregate goes to one lane. The suite commits the events itself, through
// the outbox Writer, and consumes every lane over a connection of its own.
// Each relay instance reaches the database and the broker through proxies
// of its own (internal/tcpproxy's Proxy), which the suite cuts to inject
// faults for real. The properties:
//
//   - every committed event is published and delivered, also through a
//     queue that refuses publishes while it is full (the broker nacks
//     them): the relay moves on only past confirmed publishes;
//   - with the kind's wire format left at its default, events committed in
//     bursts (transactions of several events over many aggregates, as a
//     backlog and while the relay runs) reach two consumers that run no
//     Outboxmill code, each through a queue of its own bound to the
//     exchange with a topic pattern: a stock watermill-amqp subscriber
//     (DefaultMarshaler; it declares the exchange with its
//     alternate-exchange argument, see docs/wire.md) and a raw AMQP client.
//     Each receives every event once as a message of its own: the event id
//     as Watermill's UUID and as the message-id property, the metadata as
//     string headers, AMQP's type, timestamp (the occurrence time to the
//     second), app-id (the publishing module), content type
//     application/json and persistent delivery, and a body that decodes to
//     the envelope. A lean or packed message (a relay that made either
//     its default) fails it;
//   - one aggregate's events are first delivered on its lane in version
//     order, with no version missing, whatever else happens (every
//     property checks this);
//   - events of a transaction that rolled back are never published;
//   - a transaction that commits after later ones (out of transaction-id
//     order) is not skipped;
//   - a backlog written before the relay starts is drained;
//   - a relay whose connections are all cut in the middle of a stream, as
//     when its process dies, loses nothing once another instance runs,
//     and no more than Features.MaxResent events are delivered twice;
//   - two relays on one outbox together publish every event in order, and
//     go on when the first dies; with Features.SingleActive nothing is
//     published twice while both run;
//   - the broker connection cut at the TCP level in the middle of a stream
//     loses nothing;
//   - a relay closed as its broker connection drops, in the middle of a
//     stream, stops (Close and Run return) whatever the client did with
//     the confirms it awaited, and the next instance loses nothing;
//   - with Features.SetsAsideInvalidRows, rows that are not forwarder
//     envelopes are set aside in outbox_set_aside and the rows after them
//     are published;
//   - for each of Kind.Peers, a switch to the peer kind and back in the
//     middle of a stream loses nothing: the position is stored where the
//     other kind reads it.
//
// Duplicates are counted by event id on the lanes. After each run the suite
// commits one more event for every aggregate and waits for it, so that any
// copy a relay still sends of an earlier event has arrived before it counts.
//
// Outboxmill and Watermill are the two kinds the framework ships
// (relay.KindOutboxmill and relay.KindWatermill), each the other's peer. A
// new kind, such as one reading the outbox by logical replication, runs the
// same suite with its own Factory and Features, and names a built-in kind
// as its peer when it stores its position in the outbox's offsets table.
// The whole suite takes about 20-30 s a kind on a 2-core machine.
package relaytest
