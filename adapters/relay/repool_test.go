package relay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// scriptedPublisher answers each publish with the next error of its
// script; past the script it fails the test, as a watermill-amqp publisher
// whose pool lost its channel would wait for ever.
type scriptedPublisher struct {
	t         *testing.T
	name      string
	script    []error
	published int
	closed    bool
}

func (p *scriptedPublisher) Publish(string, ...*message.Message) error {
	if p.closed {
		p.t.Fatalf("publish through %s after it was closed", p.name)
	}
	if p.published == len(p.script) {
		p.t.Fatalf("publish %d through %s: it would wait for ever", p.published+1, p.name)
	}
	err := p.script[p.published]
	p.published++
	return err
}

func (p *scriptedPublisher) Close() error { p.closed = true; return nil }

// The error watermill-amqp v3.0.2's publisher returns when its pool could
// not reopen a channel closed with the connection (errors.Wrap's text).
var errReopen = fmt.Errorf("cannot open channel: %w",
	errors.New(`create AMQP channel: Exception (504) Reason: "channel/connection is not open"`))

func TestRepoolingPublisher_ReplacesAPublisherWhosePoolLostItsChannel(t *testing.T) {
	first := &scriptedPublisher{t: t, name: "the first publisher", script: []error{nil, errReopen}}
	second := &scriptedPublisher{t: t, name: "the second publisher", script: []error{nil, nil}}
	// While the broker is away no publisher can be made.
	opens := []func() (message.Publisher, error){
		func() (message.Publisher, error) { return first, nil },
		func() (message.Publisher, error) { return nil, errors.New("dial: connection refused") },
		func() (message.Publisher, error) { return second, nil },
	}
	made := 0
	p, err := newRepoolingPublisher(func() (message.Publisher, error) {
		if made == len(opens) {
			t.Fatalf("publisher %d made, want %d", made+1, len(opens))
		}
		made++
		return opens[made-1]()
	})
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage("e1", []byte("{}"))
	if err := p.Publish("t", msg); err != nil {
		t.Fatalf("publish 1: %v", err)
	}
	if err := p.Publish("t", msg); !errors.Is(err, errReopen) {
		t.Fatalf("publish 2: %v, want the pool's error", err)
	}
	if !first.closed {
		t.Fatal("the publisher whose pool lost its channel was not closed")
	}
	if err := p.Publish("t", msg); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("publish 3, the broker away: %v, want the dial's error", err)
	}
	for i := 4; i <= 5; i++ {
		if err := p.Publish("t", msg); err != nil {
			t.Fatalf("publish %d, the broker back: %v", i, err)
		}
	}
	if second.published != 2 || made != 3 {
		t.Fatalf("the second publisher took %d publishes and %d publishers were made, want 2 and 3", second.published, made)
	}
	if err := p.Close(); err != nil || !second.closed {
		t.Fatalf("close: %v, second closed %v", err, second.closed)
	}
	if err := p.Publish("t", msg); err == nil {
		t.Fatal("publish after close: no error")
	}
}

func TestRepoolingPublisher_KeepsThePublisherOnOtherErrors(t *testing.T) {
	for _, failure := range []error{
		errors.New("not connected to AMQP"),
		fmt.Errorf("cannot open channel: %w", errors.New("provider is closed")),
		fmt.Errorf("cannot open channel: %w", errors.New("channel pool is closed")),
		errors.New("message was not delivered"),
	} {
		pub := &scriptedPublisher{t: t, name: "the publisher", script: []error{failure, nil}}
		made := 0
		p, err := newRepoolingPublisher(func() (message.Publisher, error) { made++; return pub, nil })
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Publish("t"); !errors.Is(err, failure) {
			t.Fatalf("%v: publish returned %v", failure, err)
		}
		if err := p.Publish("t"); err != nil || made != 1 || pub.closed {
			t.Fatalf("%v: then publish %v, %d publishers made, closed %v; want the same publisher kept", failure, err, made, pub.closed)
		}
	}
}

// The error watermill-amqp v3.0.2's publisher returns for a publish the
// broker nacked.
var errNacked = errors.New("delivery not confirmed for message [6f1c]")

func TestRepoolingPublisher_ReplacesAPublisherNackedPastTheBound(t *testing.T) {
	// The first publisher's channel is one RabbitMQ nacks every publish of
	// topic "stuck" on (a quorum queue's old leader); "other" goes through.
	first := &scriptedPublisher{t: t, name: "the first publisher",
		script: []error{errNacked, nil, errNacked, errNacked, errNacked, errNacked}}
	second := &scriptedPublisher{t: t, name: "the second publisher", script: []error{nil}}
	opens := []message.Publisher{first, second}
	made := 0
	p, err := newRepoolingPublisher(func() (message.Publisher, error) {
		if made == len(opens) {
			t.Fatalf("publisher %d made, want %d", made+1, len(opens))
		}
		made++
		return opens[made-1], nil
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	p.nackedFor = 5 * time.Second
	var replaced []string
	p.replaced = func(topic string, nacks int, _ time.Time) {
		replaced = append(replaced, fmt.Sprintf("%s after %d", topic, nacks))
	}
	msg := message.NewMessage("6f1c", nil)

	steps := []struct {
		topic   string
		advance time.Duration
	}{
		{"stuck", 0},               // nacked: the run starts
		{"other", time.Second},     // confirmed: another topic's run is its own
		{"stuck", 2 * time.Second}, // nacked, 3 s into the run
		{"stuck", time.Second},     // nacked, 4 s: not yet
		{"stuck", time.Second},     // nacked, 5 s and 4 nacks: replaced
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		_ = p.Publish(s.topic, msg)
		if i < len(steps)-1 && len(replaced) > 0 {
			t.Fatalf("step %d: replaced %v before the bound", i, replaced)
		}
	}
	if len(replaced) != 1 || replaced[0] != "stuck after 4" || !first.closed {
		t.Fatalf("replaced %v, first closed %v; want [stuck after 4] and closed", replaced, first.closed)
	}
	if err := p.Publish("stuck", msg); err != nil || made != 2 {
		t.Fatalf("publish after the replacement: %v through publisher %d, want nil through the second", err, made)
	}
}
