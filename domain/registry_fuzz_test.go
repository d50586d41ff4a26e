package domain_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/domain/settlement"
)

// FuzzRegistry_Decode feeds event types, schema versions and payloads, as
// an event message brings them, to Registry.Decode over the test events
// (with chained, gapped and failing upcasters) and the sample modules'. A
// refused payload gets an error wrapping ErrUnregisteredEvent,
// ErrUnknownVersion or ErrInvalidEvent, which the consumer sets aside; an
// accepted one is a valid value of the declared type that an event may
// carry (Check), and written as JSON and decoded strictly at the current
// version it reads back the same.
func FuzzRegistry_Decode(f *testing.F) {
	for _, seed := range []struct {
		eventType string
		version   int
		payload   string
	}{
		{"Greeted", 1, `{"name":"Ada"}`},
		{"Greeted", 1, `{"NAME":"Ada","name":"Grace","extra":[1,{}]}`},
		{"Greeted", 1, `{"name":"  "}`},
		{"Greeted", 2, `{"name":"Ada"}`},
		{"Renamed", 1, `{"name":"Ada Lovelace"}`},
		{"Renamed", 2, `{"full_name":"Ada Lovelace"}`},
		{"Chained", 1, `{"name":"Ada"}`},
		{"Chained", 2, `{"name":"Ada"}`},
		{"Gapped", 1, `{"value":"v"}`},
		{"Gapped", 2, `{"value":"v"}`},
		{"Failing", 1, `{"value":"v"}`},
		{"Unvalidated", 1, `{"n":1e2}`},
		{"Unvalidated", 1, `{"n":1.5}`},
		{"Unvalidated", 1, ` null `},
		{"Unvalidated", 1, `{} {}`},
		{"Unvalidated", 0, `{}`},
		{"Nobody", 1, `{}`},
		{orders.EventOrderPaid, 1, `{"order_id":"o-1","customer_id":"c\u0000","amount":1250,"currency":"EUR","paid_at":"2024-05-17T10:30:00+02:00"}`},
		{orders.EventOrderPlaced, 1, `{"order_id":"o-1","customer_id":"c-1","amount":-1,"currency":"EUR"}`},
		{settlement.EventSettlementRecorded, 1, `{"order_id":"o-1","platform_fee":10,"merchant_credit":990,"settled_at":"0000-01-01T00:00:00+01:00"}`},
	} {
		f.Add(seed.eventType, seed.version, []byte(seed.payload), false)
		f.Add(seed.eventType, seed.version, []byte(seed.payload), true)
	}
	reg, err := domain.NewRegistry(slices.Concat(testEvents(), orders.Events, settlement.Events)...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, eventType string, version int, payload []byte, strict bool) {
		value, err := reg.Decode(eventType, version, payload, strict)
		if err != nil {
			if !errors.Is(err, domain.ErrUnregisteredEvent) && !errors.Is(err, domain.ErrUnknownVersion) && !errors.Is(err, domain.ErrInvalidEvent) {
				t.Fatalf("Decode(%q, %d) refused with %v, want a registry error", eventType, version, err)
			}
			return
		}
		decl, _ := reg.Lookup(eventType)
		ev := domain.Event{
			ID: "3f1c2a9e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", Type: eventType, SchemaVersion: decl.Version, AggregateType: "A",
			AggregateID: "a-1", AggregateVersion: 1, OccurredAt: time.Unix(1, 0).UTC(), Payload: value,
		}
		if err := reg.Check(ev); err != nil {
			t.Fatalf("Decode accepted a payload an event cannot carry: %v", err)
		}
		written, err := json.Marshal(value)
		if err != nil {
			t.Fatalf("accepted payload %+v cannot be written: %v", value, err)
		}
		again, err := reg.Decode(eventType, decl.Version, written, true)
		if err != nil {
			t.Fatalf("written as %s, the payload no longer decodes: %v", written, err)
		}
		rewritten, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(rewritten, written) {
			t.Fatalf("payload %s read back as %s", written, rewritten)
		}
	})
}

// FuzzRegistry_Check checks that an event Check lets through has an id and
// aggregate that JSON, which carries events, keeps as they are: what a
// producer writes is what its consumers read.
func FuzzRegistry_Check(f *testing.F) {
	f.Add("3f1c2a9e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", "Greeter", "greeter-1")
	f.Add("id\x00", "Greeter\u2028", "<&>")
	f.Add("id", "Greeter", "g-\xff")
	f.Add("\xed\xa0\x80", "G", "g")
	reg, err := domain.NewRegistry(testEvents()...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, aggType, aggID string) {
		ev := validGreeted()
		ev.ID, ev.AggregateType, ev.AggregateID = id, aggType, aggID
		if err := reg.Check(ev); err != nil {
			if !errors.Is(err, domain.ErrInvalidEvent) {
				t.Fatalf("Check refused with %v, want ErrInvalidEvent", err)
			}
			return
		}
		for _, s := range []string{id, aggType, aggID} {
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back string
			if err := json.Unmarshal(b, &back); err != nil || back != s {
				t.Fatalf("Check accepted %q, which JSON carries as %q", s, back)
			}
		}
	})
}
