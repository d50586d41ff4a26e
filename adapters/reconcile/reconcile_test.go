package reconcile_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/reconcile"
	"github.com/outboxmill/outboxmill/adapters/retention"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
	"github.com/outboxmill/outboxmill/internal/testdb"
)

func TestRun(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	ids := testdb.IDs(db.WriteEvents(t, 7))
	db.Backdate(t, time.Hour, ids[:6]...) // ids[6] is recent
	db.SetRelayPosition(t, "relay", ids[2])
	mark := func(id, handler string) {
		t.Helper()
		if _, err := db.Exec(`INSERT INTO processed_events (event_id, handler) VALUES ($1, $2)`, id, handler); err != nil {
			t.Fatal(err)
		}
	}
	mark(ids[0], "h")
	mark(ids[1], "other") // another handler's marker does not count
	if _, err := db.Exec(`INSERT INTO set_aside_messages (handler, message_id, topic, payload, reason, attempts)
		VALUES ('h', $1, 'q', '\x00', 'test', 1)`, ids[1]); err != nil {
		t.Fatal(err)
	}
	// ids[2] is forwarded but not processed; ids[3] and ids[4] are not
	// forwarded yet. ids[5] was discarded by h's operator, ids[4] from
	// the outbox, and ids[3] by another handler's (which does not count
	// for h).
	for _, d := range []postgres.Discard{
		{EventID: ids[5], Handler: "h", Reason: "handler failed", DiscardedBy: "op"},
		{EventID: ids[4], Outbox: testdb.Outbox.Topic, Reason: "poison", DiscardedBy: "op"},
		{EventID: ids[3], Handler: "other", Reason: "handler failed", DiscardedBy: "op"},
	} {
		if err := postgres.RecordDiscard(ctx, db, d); err != nil {
			t.Fatal(err)
		}
	}

	report, err := reconcile.Run(ctx, reconcile.Config{
		Producer: db.DB, Outbox: testdb.Outbox, ConsumerGroup: "relay", Consumer: db.DB,
		Routes:    []reconcile.Route{{Handler: "h", EventTypes: []string{orders.EventOrderPaid}}, {Handler: "none", EventTypes: []string{"NoSuchEvent"}}},
		OlderThan: time.Minute, BatchSize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Handlers) != 2 {
		t.Fatalf("handlers: %+v", report.Handlers)
	}
	if h := report.Handlers[0]; h.Committed != 6 || h.Processed != 1 || h.Missing != 3 || h.Discarded != 2 {
		t.Fatalf("summary of h: %+v, want 6 committed, 1 processed, 3 missing, 2 discarded", h)
	}
	if h := report.Handlers[1]; h.Committed != 0 || h.Missing != 0 {
		t.Fatalf("summary of a handler with no events: %+v", h)
	}
	want := map[string]string{
		ids[1]: reconcile.StateSetAside,
		ids[2]: reconcile.StateUnprocessed,
		ids[3]: reconcile.StateUnforwarded,
	}
	if len(report.Missing) != len(want) || report.OK() {
		t.Fatalf("missing: %+v, want %v", report.Missing, want)
	}
	for _, m := range report.Missing {
		if want[m.EventID] != m.State || m.Handler != "h" || m.EventType != orders.EventOrderPaid || m.Age < time.Hour {
			t.Errorf("missing %+v, want state %q", m, want[m.EventID])
		}
	}
	gone := map[string]reconcile.Discarded{}
	for _, d := range report.Discarded {
		gone[d.EventID] = d
	}
	if d := gone[ids[5]]; len(gone) != 2 || d.Handler != "h" || d.Reason != "handler failed" || d.DiscardedBy != "op" || !d.Committed || d.EventType != orders.EventOrderPaid {
		t.Fatalf("discarded: %+v", report.Discarded)
	}
	if d := gone[ids[4]]; d.Outbox != testdb.Outbox.Topic || d.Handler != "h" || d.Reason != "poison" {
		t.Fatalf("discarded from the outbox: %+v", d)
	}
}

// paid returns an OrderPaid event of order orderID.
func paid(orderID string) domain.Event {
	now := time.Now().UTC()
	return domain.Event{
		ID: domain.NewEventID(), Type: orders.EventOrderPaid, SchemaVersion: 1,
		AggregateType: orders.OrderAggregateType, AggregateID: orderID, AggregateVersion: 2, OccurredAt: now,
		Payload: orders.OrderPaidPayload{OrderID: orderID, CustomerID: "c-1", Amount: 1000, Currency: "EUR", PaidAt: now},
	}
}

// commit runs write in a transaction of db and commits it.
func commit(t *testing.T, db *testdb.DB, write func(*sqlx.Tx) error) {
	t.Helper()
	tx, err := db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	if err := write(tx); err != nil {
		_ = tx.Rollback()
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func TestFindUnknown(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	committed := testdb.IDs(db.WriteEvents(t, 2))
	now := time.Now().UTC()
	recorded := domain.Event{
		ID: domain.NewEventID(), Type: settlement.EventSettlementRecorded, SchemaVersion: 1,
		AggregateType: settlement.AggregateType, AggregateID: "o-1", AggregateVersion: 1, OccurredAt: now,
		Payload: settlement.SettlementRecordedPayload{OrderID: "o-1", Currency: "EUR", PlatformFee: 3, MerchantCredit: 97, SettledAt: now},
	}
	commit(t, db, func(tx *sqlx.Tx) error {
		return testdb.Writer(t, testdb.SettlementOutbox).Write(ctx, tx, []domain.Event{recorded})
	})
	exec := func(query string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, query, args...); err != nil {
			t.Fatal(err)
		}
	}
	marker := func(id, handler string, age time.Duration) {
		t.Helper()
		exec(`INSERT INTO processed_events (event_id, handler, processed_at) VALUES ($1, $2, now() - $3::bigint * interval '1 microsecond')`, id, handler, age.Microseconds())
	}
	marker(committed[0], "h", time.Hour)
	marker(recorded.ID, "h", time.Hour) // committed by the other source
	marker("forged-1", "h", time.Hour)
	marker("forged-old", "h", 30*24*time.Hour) // before the window: its event may have been purged
	marker("forged-recent", "h", 0)            // more recent than OlderThan
	marker("forged-other", "other", time.Hour) // another handler's
	exec(`INSERT INTO set_aside_messages (handler, message_id, topic, payload, metadata, reason, attempts, set_aside_at)
		VALUES ('h', $1, 'q', 'x', '{"event_type": "OrderPaid", "aggregate_id": "o-9"}', 'no settlement of order o-9', 1, now() - interval '1 hour'),
		       ('h', $2, 'q', 'x', '{"event_type": "OrderPaid"}', 'handler failed', 5, now() - interval '1 hour')`, "forged-2", committed[1])
	for _, d := range []postgres.Discard{
		{EventID: "forged-3", Handler: "h", Reason: "settled already", DiscardedBy: "op"},
		{EventID: committed[1], Handler: "h", Reason: "handler failed", DiscardedBy: "op"},
	} {
		if err := postgres.RecordDiscard(ctx, db, d); err != nil {
			t.Fatal(err)
		}
	}
	exec(`UPDATE discarded_events SET discarded_at = now() - interval '1 hour'`)

	unknown, gone, err := reconcile.FindUnknown(ctx, reconcile.UnknownConfig{
		Sources: []reconcile.Source{
			{Module: "orders", DB: db.DB, Outbox: testdb.Outbox},
			{Module: "settlement", DB: db.DB, Outbox: testdb.SettlementOutbox},
		},
		Consumer: db.DB, Handler: "h",
		EventTypes: []string{orders.EventOrderPaid, settlement.EventSettlementRecorded},
		OlderThan:  time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 2 || unknown[0].EventID != "forged-1" || unknown[0].State != reconcile.UnknownProcessed ||
		unknown[1].EventID != "forged-2" || unknown[1].State != reconcile.UnknownSetAside || unknown[1].EventType != orders.EventOrderPaid ||
		unknown[1].AggregateID != "o-9" || !strings.Contains(unknown[1].Reason, "no settlement") {
		t.Fatalf("unknown: %+v", unknown)
	}
	if len(gone) != 1 || gone[0].EventID != "forged-3" || gone[0].Committed || gone[0].Reason != "settled already" {
		t.Fatalf("discarded: %+v", gone)
	}

	// Without the settlement outbox among the sources, its event is
	// unknown too.
	unknown, _, err = reconcile.FindUnknown(ctx, reconcile.UnknownConfig{
		Sources:  []reconcile.Source{{Module: "orders", DB: db.DB, Outbox: testdb.Outbox}},
		Consumer: db.DB, Handler: "h", EventTypes: []string{orders.EventOrderPaid, settlement.EventSettlementRecorded},
		OlderThan: time.Minute,
	})
	if err != nil || len(unknown) != 3 {
		t.Fatalf("unknown with one source: %+v, %v", unknown, err)
	}
	if _, _, err := reconcile.FindUnknown(ctx, reconcile.UnknownConfig{Consumer: db.DB, Handler: "h"}); err == nil {
		t.Fatal("FindUnknown without sources and event types: no error")
	}
}

func TestCheckEffects(t *testing.T) {
	t.Parallel()
	db := testdb.NewServices(t)
	ctx := context.Background()
	events := map[string]domain.Event{}
	for _, name := range []string{"a", "b", "c1", "c2", "d"} {
		events[name] = paid("order-" + name[:1])
	}
	commit(t, db, func(tx *sqlx.Tx) error {
		var all []domain.Event
		for _, e := range events {
			all = append(all, e)
		}
		return testdb.Writer(t, testdb.Outbox).Write(ctx, tx, all)
	})
	if _, err := db.ExecContext(ctx, `CREATE TABLE effects (key TEXT NOT NULL, event_id TEXT NOT NULL, recorded_at TIMESTAMPTZ NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	effect := func(key, eventID string, age time.Duration) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2, now() - $3::bigint * interval '1 microsecond')`, key, eventID, age.Microseconds()); err != nil {
			t.Fatal(err)
		}
	}
	effect("order-a", events["a"].ID, time.Hour)  // verified
	effect("order-b", events["b"].ID, time.Hour)  // verified, but settled twice:
	effect("order-b", "forged-b", time.Hour)      // not committed, the key has b
	effect("order-c", events["c1"].ID, time.Hour) // the key has two committed events
	effect("order-d", events["a"].ID, time.Hour)  // a's event, not d's
	effect("order-e", "forged-e", time.Hour)      // never committed
	effect("order-f", "gone-f", 30*24*time.Hour)  // before the window: unverified
	effect("order-g", "forged-g", -time.Hour)     // recorded after the check's clock: left out
	check := reconcile.Check{
		Name: "test effects", EventType: orders.EventOrderPaid,
		Effects: func(ctx context.Context, db *sqlx.DB, before time.Time, fn func(reconcile.Effect) error) error {
			rows, err := db.QueryxContext(ctx, `SELECT key, event_id, recorded_at FROM effects WHERE recorded_at < $1 ORDER BY key, event_id`, before)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var e reconcile.Effect
				if err := rows.Scan(&e.Key, &e.EventID, &e.RecordedAt); err != nil {
					return err
				}
				if err := fn(e); err != nil {
					return err
				}
			}
			return rows.Err()
		},
	}
	sum, findings, err := reconcile.CheckEffects(ctx, reconcile.EffectsConfig{
		Check: check, Module: "m", Consumer: db.DB,
		Source: reconcile.Source{Module: "orders", DB: db.DB, Outbox: testdb.Outbox},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Effects != 7 || sum.Verified != 3 || sum.Unverified != 1 || sum.Findings != 5 || sum.Publisher != "orders" || sum.Module != "m" {
		t.Fatalf("summary: %+v", sum)
	}
	got := map[string]string{}
	for _, f := range findings {
		got[f.Key+" "+f.Problem] = f.Detail
		if f.Check != "test effects" || f.Module != "m" {
			t.Errorf("finding %+v: check and module not named", f)
		}
	}
	for key, detail := range map[string]string{
		"order-b " + reconcile.ProblemSeveralEffects: "2 effects",
		"order-b " + reconcile.ProblemNotCommitted:   "the committed OrderPaid of order-b is " + events["b"].ID,
		"order-c " + reconcile.ProblemSeveralEvents:  "2 committed OrderPaid events",
		"order-d " + reconcile.ProblemOtherAggregate: "of order-a, not of order-d",
		"order-e " + reconcile.ProblemNotCommitted:   "order-e has no committed OrderPaid",
	} {
		if !strings.Contains(got[key], detail) {
			t.Errorf("finding %s: %q, want it to say %q (all: %v)", key, got[key], detail, got)
		}
	}
	if len(findings) != 5 {
		t.Errorf("findings: %+v", findings)
	}
	if _, _, err := reconcile.CheckEffects(ctx, reconcile.EffectsConfig{Check: reconcile.Check{Name: "x"}, Consumer: db.DB,
		Source: reconcile.Source{DB: db.DB, Outbox: testdb.Outbox}}); err == nil {
		t.Fatal("a check without event type and effects: no error")
	}
}

func TestDefaultWindow(t *testing.T) {
	if reconcile.DefaultWindow != retention.DefaultOutboxRetention {
		t.Fatalf("DefaultWindow %s, want the default outbox retention %s", reconcile.DefaultWindow, retention.DefaultOutboxRetention)
	}
}
