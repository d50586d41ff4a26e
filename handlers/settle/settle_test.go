package settle_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/handlers/settle"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/middleware"
)

// paid returns the OrderPaid message of a new order of amount.
func paid(t *testing.T, amount int64) (*message.Message, string) {
	t.Helper()
	now := time.Now()
	order, _, err := domain.PlaceOrder(domain.NewEventID(), "customer-1", amount, "EUR", now)
	if err != nil {
		t.Fatal(err)
	}
	events, err := order.Pay(amount, now)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := outbox.Encode(events[0])
	if err != nil {
		t.Fatal(err)
	}
	msg.SetContext(context.Background())
	return msg, order.ID()
}

func TestHandler_HandleBatch(t *testing.T) {
	t.Parallel()
	db := testdb.NewSettlement(t)
	ledger := postgres.NewSettlementLedger(db.DB)
	h := settle.NewHandler(ledger)
	dedup := middleware.Dedup{DB: db.DB, Handler: settle.HandlerName}
	ctx := context.Background()

	for _, tc := range []struct {
		name    string
		process func([]*message.Message) (int, error)
	}{
		{"in a transaction", func(msgs []*message.Message) (int, error) { return dedup.ProcessBatch(ctx, msgs, h.HandleBatch) }},
		{"pipelined", func(msgs []*message.Message) (int, error) { return dedup.PipelineBatch(ctx, msgs, h.BatchStatements) }},
	} {
		t.Run("settles every order of the batch "+tc.name, func(t *testing.T) {
			t.Parallel()
			settlesEveryOrder(t, ledger, tc.process)
		})
	}
	t.Run("a malformed event fails the statements", func(t *testing.T) {
		t.Parallel()
		bad, _ := paid(t, 1000)
		bad.Payload = []byte(`{"order_id": 12}`)
		if _, err := h.BatchStatements([]*message.Message{bad}); !middleware.IsPermanent(err) {
			t.Fatalf("got %v, want a permanent error", err)
		}
	})
	t.Run("one malformed event fails the batch with nothing appended", func(t *testing.T) {
		t.Parallel()
		good, order := paid(t, 1000)
		bad, _ := paid(t, 1000)
		bad.Payload = []byte(`{"order_id": 12}`)
		_, err := dedup.ProcessBatch(ctx, []*message.Message{good, bad}, h.HandleBatch)
		if !middleware.IsPermanent(err) || !errors.Is(err, outbox.ErrMalformedEvent) {
			t.Fatalf("got %v, want a permanent malformed-event error", err)
		}
		if n := db.Count(t, `SELECT count(*) FROM settlement_entries WHERE order_id = $1`, order); n != 0 {
			t.Errorf("%d entries of the good order appended by a failed batch", n)
		}
		// Alone, the good one settles.
		single := func(msg *message.Message) ([]*message.Message, error) { return nil, h.Handle(msg) }
		if _, err := dedup.Middleware(single)(good); err != nil {
			t.Fatal(err)
		}
		if n := db.Count(t, `SELECT count(*) FROM settlement_entries WHERE order_id = $1`, order); n != 2 {
			t.Errorf("%d entries after settling the good order alone, want 2", n)
		}
	})
}

// settlesEveryOrder settles three paid orders in one batch with process
// and checks their entries.
func settlesEveryOrder(t *testing.T, ledger *postgres.SettlementLedger, process func([]*message.Message) (int, error)) {
	t.Helper()
	amounts := []int64{1000, 2500, 99}
	var msgs []*message.Message
	var orders []string
	for _, amount := range amounts {
		msg, order := paid(t, amount)
		msgs, orders = append(msgs, msg), append(orders, order)
	}
	if n, err := process(msgs); err != nil || n != 3 {
		t.Fatalf("settled %d, err %v; want 3", n, err)
	}
	for i, amount := range amounts {
		s, err := ledger.Get(context.Background(), orders[i])
		if err != nil {
			t.Fatal(err)
		}
		want, _ := domain.SettlementEntries(amount)
		if !slices.Equal(s.Entries, want) || s.Currency != "EUR" {
			t.Errorf("order %s: entries %+v in %s, want %+v in EUR", orders[i], s.Entries, s.Currency, want)
		}
	}
}
