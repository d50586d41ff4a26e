package chaos

import (
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/stack"
)

// TestScenario_Account checks the ledger's arithmetic on made-up deliveries,
// so that a clean ledger from a chaos run means what it says.
func TestScenario_Account(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	committed := []committedEvent{
		{ID: "a1", Type: "OrderPlaced", AggregateID: "a", Version: 1},
		{ID: "a2", Type: "OrderPaid", AggregateID: "a", Version: 2},
		{ID: "b1", Type: "OrderPlaced", AggregateID: "b", Version: 1},
		{ID: "b2", Type: "OrderPaid", AggregateID: "b", Version: 2},
		{ID: "c1", Type: "OrderPlaced", AggregateID: "c", Version: 1},
	}
	d := func(id, agg string, version, ms int) delivery {
		return delivery{EventID: id, AggregateID: agg, AggregateVersion: version, At: at(ms)}
	}
	tests := []struct {
		name       string
		deliveries []delivery
		want       ledger
	}{{
		name:       "in order once",
		deliveries: []delivery{d("a1", "a", 1, 10), d("b1", "b", 1, 20), d("a2", "a", 2, 30), d("b2", "b", 2, 40), d("c1", "c", 1, 50)},
		want:       ledger{Delivered: 5, Copies: 5},
	}, {
		name: "republished batch is redelivery, not disorder",
		deliveries: []delivery{d("a1", "a", 1, 10), d("a2", "a", 2, 20), d("a1", "a", 1, 30), d("a2", "a", 2, 40), d("a1", "a", 1, 50),
			d("b1", "b", 1, 60), d("b2", "b", 2, 70), d("c1", "c", 1, 80)},
		want: ledger{Delivered: 5, Copies: 8, Redeliveries: 3, MaxRedeliveries: 2},
	}, {
		name:       "lower version first delivered later is out of order",
		deliveries: []delivery{d("a2", "a", 2, 5), d("a1", "a", 1, 10), d("b1", "b", 1, 30), d("b2", "b", 2, 40), d("c1", "c", 1, 50)},
		want:       ledger{Delivered: 5, Copies: 5, OutOfOrder: 1},
	}, {
		name:       "lost and ghost",
		deliveries: []delivery{d("a1", "a", 1, 10), d("a2", "a", 2, 20), d("b1", "b", 1, 30), d("x1", "x", 1, 40)},
		want:       ledger{Delivered: 3, Copies: 4, LostEvents: 2, Ghosts: 1},
	}}
	// counts drops what the made-up deliveries do not decide.
	counts := func(l ledger) ledger {
		return ledger{
			Committed: l.Committed, CommittedPaid: l.CommittedPaid, Delivered: l.Delivered, Copies: l.Copies,
			Settled: l.Settled, LostEvents: l.LostEvents, Ghosts: l.Ghosts, OutOfOrder: l.OutOfOrder,
			Redeliveries: l.Redeliveries, MaxRedeliveries: l.MaxRedeliveries, MaxDelay: l.MaxDelay,
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Only a1's commit time is known: 10 ms before its delivery.
			sc := &scenario{name: "test", extraCommits: map[eventKey]time.Time{{"a", 1}: at(0)}}
			got := counts(sc.account(committed, tt.deliveries, stack.Books{Settled: 2}))
			want := tt.want
			want.Committed, want.CommittedPaid, want.Settled, want.MaxDelay = 5, 2, 2, 10*time.Millisecond
			if got.line() != want.line() {
				t.Errorf("ledger = %s\nwant     %s", got.line(), want.line())
			}
		})
	}
}
