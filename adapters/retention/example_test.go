package retention_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// TicketOpened is the payload of the example's event type.
type TicketOpened struct {
	Subject string `json:"subject"`
}

// The dedup window must outlive the outbox rows: while a row exists its
// event can be published again, and only the marker stops a second effect.
func ExampleConfig_Validate() {
	fmt.Println(retention.Config{}.Validate())
	err := retention.Config{OutboxRetention: 14 * 24 * time.Hour, DedupWindow: 7 * 24 * time.Hour}.Validate()
	fmt.Println(err != nil)
	// Output:
	// <nil>
	// true
}

// A module's own rows (here expired idempotency keys) are purged in bounded
// batches, like the framework's tables. A module returns such rules from
// module.Module.Retention; the process runs them on the retention interval.
func ExampleNewRulePurger() {
	db, drop := exampleenv.DB()
	defer drop()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE idempotency_keys (key text PRIMARY KEY, created_at timestamptz NOT NULL);
		CREATE INDEX ON idempotency_keys (created_at);
		INSERT INTO idempotency_keys VALUES ('a', now() - interval '3 days'), ('b', now() - interval '2 days'), ('c', now())`); err != nil {
		fmt.Println(err)
		return
	}

	rule := retention.Rule{Table: "idempotency_keys", Column: "created_at", Keep: 24 * time.Hour}
	p, err := retention.NewRulePurger(db, rule, retention.Config{BatchSize: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, dryRun := range []bool{true, false} {
		res, err := p.Purge(ctx, dryRun)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: dry run %v, purged %d\n", res.Table, res.DryRun, res.Purged)
	}
	var left int
	if err := db.GetContext(ctx, &left, `SELECT count(*) FROM idempotency_keys`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("left:", left)
	// Output:
	// idempotency_keys: dry run true, purged 2
	// idempotency_keys: dry run false, purged 2
	// left: 1
}

// An outbox row is purged only once every relay group has passed it: rows
// old enough but not forwarded are held, never lost.
func ExampleNewOutboxPurger() {
	db, drop := exampleenv.DB()
	defer drop()
	ctx := context.Background()
	box := outbox.ForModule("helpdesk")
	exampleCommitOld(db, box, 3, 8*24*time.Hour)

	p, err := retention.NewOutboxPurger(db, box, retention.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := p.Purge(ctx, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("purged:", res.Purged, "held:", res.Held)
	// Output:
	// purged: 0 held: 3
}

// exampleCommitOld commits n events to box, written age ago, with no relay to
// forward them.
func exampleCommitOld(db *sqlx.DB, box outbox.Config, n int, age time.Duration) {
	var events []domain.Event
	for i := range n {
		events = append(events, domain.Event{
			ID: domain.NewEventID(), Type: "TicketOpened", SchemaVersion: 1,
			AggregateType: "Ticket", AggregateID: fmt.Sprintf("ticket-%d", i), AggregateVersion: 1,
			OccurredAt: time.Now().UTC(), Payload: TicketOpened{Subject: "printer on fire"},
		})
	}
	exampleenv.Commit(db, box, []domain.EventType{domain.Declare[TicketOpened]("TicketOpened", 1)}, events...)
	if _, err := db.ExecContext(context.Background(), `UPDATE `+box.Table()+` SET created_at = created_at - $1::bigint * interval '1 microsecond'`, age.Microseconds()); err != nil {
		panic(err)
	}
}
