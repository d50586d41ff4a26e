package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/metrics"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/consumer"
	"github.com/outboxmill/outboxmill/domain"
)

// infraFailures returns the sum of the handler's infrastructure failures
// counted (outboxmill_consumer_infrastructure_failures_total), of class
// when it is not empty.
func (f *fixture) infraFailures(handler, class string) float64 {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_consumer_infrastructure_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["handler"] == handler && (class == "" || labels["class"] == class) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// retries returns the handler's outboxmill_consumer_retries_total.
func (f *fixture) retries(handler string) float64 {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metrics.Namespace+"_consumer_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "handler" && l.GetValue() == handler {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// alterDatabase sets a parameter of the fixture's database for the sessions
// opened after it, and returns a new pool of 3 sessions on it.
func (f *fixture) alterDatabase(setting, value string) *sqlx.DB {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := f.db.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %s SET %s = %s`, f.db.Name, setting, value)); err != nil {
		f.t.Fatal(err)
	}
	db, err := postgres.Open(ctx, f.db.URL, 3)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = db.Close() })
	return db
}

// A handler waiting behind a lock held longer than its whole retry budget,
// on a database with lock_timeout or statement_timeout set, fails with
// 55P03 or 57014 again and again: those are the infrastructure's failures,
// retried without spending the message's attempts, and the event is
// applied once the lock is released; nothing is set aside.
func TestConsumer_LockTimeoutSpendsNoAttempts(t *testing.T) {
	for _, tc := range []struct{ setting, class string }{
		{"lock_timeout", "lock_timeout"},
		{"statement_timeout", "canceled"},
	} {
		t.Run(tc.setting, func(t *testing.T) {
			kinds(t, func(t *testing.T, kind string) {
				f := newFixture(t)
				db := f.alterDatabase(tc.setting, "'150ms'")
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				// The lock a plain CREATE INDEX takes: reads go on, writes
				// wait.
				locker, err := f.db.BeginTxx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer locker.Rollback()
				if _, err := locker.ExecContext(ctx, `SET LOCAL lock_timeout = 0; LOCK TABLE applied IN SHARE MODE`); err != nil {
					t.Fatal(err)
				}

				s := spec{kind: kind}
				h := f.handler(&s)
				types, err := h.EventTypes(f.reg)
				if err != nil {
					t.Fatal(err)
				}
				queues := f.declare(s.name, 1, types)
				cfg := f.config(s, queues)
				cfg.DB = db
				c, err := consumer.New(h, cfg)
				if err != nil {
					t.Fatal(err)
				}
				f.run(c, kind)
				ev := accountEvent(newAccountID(), 1)
				f.publish(ev)

				// Held until the message was set aside (its attempts spent)
				// or has failed far more often than its attempts allow.
				const enough = 6
				eventually(t, timeout, func() bool {
					return len(f.setAside()) > 0 || f.infraFailures(s.name, tc.class) >= enough
				}, "the event to fail %d times behind the lock, or to be set aside", enough)
				if err := locker.Rollback(); err != nil {
					t.Fatal(err)
				}
				if rows := f.setAside(); len(rows) != 0 {
					t.Fatalf("set aside behind a lock (%s): %+v", tc.setting, rows)
				}
				f.waitApplied(ev)
				if n := f.rows(ev.ID); n != 1 {
					t.Errorf("event applied %d times, want 1", n)
				}
				if rows := f.setAside(); len(rows) != 0 {
					t.Errorf("set aside: %+v", rows)
				}
				if n := f.retries(s.name); n != 0 {
					t.Errorf("%v attempts spent on failures of the infrastructure, want 0", n)
				}
			})
		})
	}
}

// A database set read-only, then writable again without ending its
// sessions: the pool's sessions, opened read-only, are replaced, and the
// events go through; nothing is set aside.
func TestConsumer_ReadOnlySessionsAreReplaced(t *testing.T) {
	kinds(t, func(t *testing.T, kind string) {
		f := newFixture(t)
		db := f.alterDatabase("default_transaction_read_only", "on")
		s := spec{kind: kind}
		h := f.handler(&s)
		types, err := h.EventTypes(f.reg)
		if err != nil {
			t.Fatal(err)
		}
		queues := f.declare(s.name, 1, types)
		cfg := f.config(s, queues)
		cfg.DB = db
		c, err := consumer.New(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		rollbacks := func() int {
			return f.count(`SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()`)
		}
		before := rollbacks()
		f.run(c, kind)
		first := accountEvent(newAccountID(), 1)
		f.publish(first)
		eventually(t, timeout, func() bool {
			return len(f.setAside()) > 0 || rollbacks() >= before+3
		}, "the event to fail on the read-only database, or to be set aside")
		if rows := f.setAside(); len(rows) != 0 {
			t.Fatalf("set aside on a read-only database: %+v", rows)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		// Writable again for new sessions; the pool's stay as they are.
		if _, err := f.db.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %s RESET default_transaction_read_only`, f.db.Name)); err != nil {
			t.Fatal(err)
		}
		second := accountEvent(newAccountID(), 1)
		f.publish(second)
		f.waitApplied(first, second)
		if rows := f.setAside(); len(rows) != 0 {
			t.Errorf("set aside: %+v", rows)
		}
		if n := f.retries(s.name); n != 0 {
			t.Errorf("%v attempts spent on a read-only database, want 0", n)
		}
	})
}

// A held event whose predecessor is applied during its hold, but whose
// release fails for the infrastructure's fault until the hold has ended,
// is still released once the infrastructure works again: an outage never
// leaves it set aside.
func TestConsumer_HeldReleaseOutlastsItsHold(t *testing.T) {
	f := newFixture(t)
	var blocked atomic.Bool
	recording := f.recordingCases(handlerName)
	cases := []consumer.Case{
		recording[0],
		consumer.On(func(ctx context.Context, tx postgres.Tx, ev consumer.Event[Deposited]) ([]domain.Event, error) {
			if blocked.Load() {
				return nil, &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout (test)"}
			}
			return nil, record(ctx, tx, handlerName, ev.ID, ev.Type, ev.SchemaVersion, ev.AggregateType, ev.AggregateID, ev.AggregateVersion,
				ev.Payload.AmountCents, ev.Payload.Currency, "")
		}),
	}
	f.start(spec{cases: cases, holdFor: 2 * time.Second})
	a := newAccountID()
	v1, v2 := accountEvent(a, 1), accountEvent(a, 2)
	f.publish(v2)
	held := f.waitSetAside(v2.ID)
	blocked.Store(true)
	f.publish(v1)
	f.waitApplied(v1)
	eventually(t, timeout, func() bool {
		return f.count(`SELECT count(*) FROM set_aside_messages WHERE id = $1 AND held_until < now()`, held.ID) == 1
	}, "the hold of v2 to end")
	if n := f.rows(v2.ID); n != 0 {
		t.Fatalf("v2 applied while its release failed")
	}
	blocked.Store(false)
	f.waitApplied(v2)
	eventually(t, timeout, func() bool { return len(f.setAsideOf(v2.ID)) == 0 }, "released v2 to leave set_aside_messages")
	if got := f.versions(a); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("versions of %s: %v, want [1 2]", a, got)
	}
	if n := f.infraFailures(handlerName, "lock_timeout"); n < 1 {
		t.Errorf("%v failed releases counted, want at least 1", n)
	}
}
