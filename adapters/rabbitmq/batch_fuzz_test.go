package rabbitmq

import (
	"errors"
	"strings"
	"testing"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/middleware"
)

// FuzzBatchConsumer_Runs drives the batch consumer's decode path as far as
// it goes without a broker and a database: a batch of deliveries with any
// message ids (text of any bytes and length, none, or a header of another
// type) is unmarshalled as lane.handle does and split into runs. Every
// delivery must be settled exactly once and in order; a message whose id
// cannot be a dedup key goes alone to the fallback, whose dedup refuses it
// with the documented error (no id, or middleware.ErrUnusableMessageID), and
// the others are settled in the longest batches between those.
//
// The input lists the ids, one per line: a line "-" is a delivery without
// the UUID header, a line starting with "#" one whose UUID header is a
// number.
func FuzzBatchConsumer_Runs(f *testing.F) {
	f.Add("6f1c2a9e-0000-4000-8000-000000000001\n6f1c2a9e-0000-4000-8000-000000000002")
	f.Add("a\n-\nb\n#5\nc\nd\n\ne")
	f.Add("id\x00nul\nok\n\xff\xfe\n" + strings.Repeat("x", middleware.MaxMessageIDLen+1) + "\n" + strings.Repeat("y", middleware.MaxMessageIDLen))
	f.Add("-")
	f.Fuzz(func(t *testing.T, ids string) {
		lines := strings.Split(ids, "\n")
		if len(lines) > DefaultMaxBatch {
			lines = lines[:DefaultMaxBatch]
		}
		msgs := make([]*message.Message, len(lines))
		for i, line := range lines {
			headers := amqp.Table{"event_type": "OrderPaid"}
			switch {
			case line == "-":
			case strings.HasPrefix(line, "#"):
				headers[wmamqp.DefaultMessageUUIDHeaderKey] = int32(len(line))
			default:
				headers[wmamqp.DefaultMessageUUIDHeaderKey] = line
			}
			msg, err := Marshaler{}.Unmarshal(amqp.Delivery{Acknowledger: fuzzAck{}, Headers: headers, Body: []byte("{}")})
			if err != nil {
				t.Fatalf("delivery %d: %v", i, err)
			}
			msgs[i] = msg
		}

		next := 0
		for i, r := range runs(msgs) {
			if r.start != next || r.end <= r.start || r.end > len(msgs) {
				t.Fatalf("run %d is [%d, %d) after %d settled of %d", i, r.start, r.end, next, len(msgs))
			}
			next = r.end
			if r.alone {
				id := msgs[r.start].UUID
				if r.end != r.start+1 || usableID(id) {
					t.Fatalf("run %d [%d, %d) goes alone, with id %.40q", i, r.start, r.end, id)
				}
				if id != "" && !errors.Is(middleware.CheckMessageID(id), middleware.ErrUnusableMessageID) {
					t.Fatalf("message %.40q goes alone, but its dedup would take it", id)
				}
				continue
			}
			for _, msg := range msgs[r.start:r.end] {
				if !usableID(msg.UUID) {
					t.Fatalf("message %.40q in batch run %d cannot be a dedup key", msg.UUID, i)
				}
			}
			if r.end < len(msgs) && usableID(msgs[r.end].UUID) {
				t.Fatalf("batch run %d ends at %d before a message that could join it", i, r.end)
			}
		}
		if next != len(msgs) {
			t.Fatalf("%d of %d deliveries settled", next, len(msgs))
		}
	})
}

// fuzzAck stands for the channel a delivery is acknowledged on.
type fuzzAck struct{}

func (fuzzAck) Ack(uint64, bool) error        { return nil }
func (fuzzAck) Nack(uint64, bool, bool) error { return nil }
func (fuzzAck) Reject(uint64, bool) error     { return nil }
