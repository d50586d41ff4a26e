package relay

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// repoolingPublisher publishes through a watermill-amqp publisher and
// replaces it with a new one when its channel pool has lost its channel.
//
// watermill-amqp v3.0.2's pooled channel provider takes a channel out of
// the pool for each publish and, when that channel was closed with the
// broker connection, reopens it; if the connection is not back yet, the
// reopening fails and the channel is never put back. With the relay's pool
// of one channel, every later publish would then wait for a channel for
// ever, and the forwarder would stall after a broker cut. The failed
// publish returns an error starting with "cannot open channel"; that
// publisher is then closed and the next publish goes through a new one,
// with a connection and a pool of its own. While a new one cannot be made
// (the broker is still away), each publish tries again and fails, and the
// forwarder sends the row again later, as for any failed publish.
//
// It replaces its publisher too when the broker nacked every publish of a
// topic (at least minNacksToReplace, none confirmed in between) for
// nackedFor: RabbitMQ 3.10 can nack every publish to a quorum queue on a
// channel opened while the queue elected a new leader, for as long as the
// channel lives (see errNackedChannel).
type repoolingPublisher struct {
	// open makes a publisher.
	open func() (message.Publisher, error)
	// nackedFor is Config.NackedReplaceAfter; 0 or negative: never.
	nackedFor time.Duration
	// replaced, when set, is called after a publisher nacked past
	// nackedFor was dropped.
	replaced func(topic string, nacks int, since time.Time)
	// now is the clock; time.Now unless a test sets it.
	now func() time.Time

	// mu guards the fields below, not the publishes: a publish waiting
	// for its confirm does not hold Close back.
	mu     sync.Mutex
	pub    message.Publisher // nil while none could be made
	closed bool
	nacked map[string]nackRun // per topic: the nacks since its last confirmed publish
}

func newRepoolingPublisher(open func() (message.Publisher, error)) (*repoolingPublisher, error) {
	pub, err := open()
	if err != nil {
		return nil, err
	}
	return &repoolingPublisher{open: open, pub: pub, now: time.Now, nacked: map[string]nackRun{}}, nil
}

// current returns the publisher to publish through, making one if there
// is none.
func (p *repoolingPublisher) current() (message.Publisher, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("relay: the broker publisher is closed")
	}
	if p.pub == nil {
		pub, err := p.open()
		if err != nil {
			return nil, fmt.Errorf("relay: reopen the broker publisher: %w", err)
		}
		p.pub = pub
	}
	return p.pub, nil
}

// Publish implements message.Publisher.
func (p *repoolingPublisher) Publish(topic string, msgs ...*message.Message) error {
	pub, err := p.current()
	if err != nil {
		return err
	}
	err = pub.Publish(topic, msgs...)
	if p.nackedTooLong(topic, err) {
		p.drop(pub)
		return err
	}
	if err != nil && lostPooledChannel(err) {
		// Its pool is empty for good: close it (a closing error says
		// nothing new) and make another at the next publish.
		p.mu.Lock()
		if p.pub == pub {
			p.pub = nil
		}
		p.mu.Unlock()
		_ = closePublisher(pub)
	}
	return err
}

// nackedTooLong records the outcome err of a publish of topic and reports
// whether every publish of topic has now been nacked for nackedFor.
func (p *repoolingPublisher) nackedTooLong(topic string, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.nacked, topic)
		return false
	}
	if !nackedPublish(err) || p.nackedFor <= 0 {
		return false
	}
	run, ok := p.nacked[topic]
	if !ok {
		run.first = p.now()
	}
	run.n++
	p.nacked[topic] = run
	if run.n < minNacksToReplace || p.now().Sub(run.first) < p.nackedFor {
		return false
	}
	delete(p.nacked, topic)
	if p.replaced != nil {
		p.replaced(topic, run.n, run.first)
	}
	return true
}

// drop closes pub, unless it was replaced already, so that the next
// publish makes another.
func (p *repoolingPublisher) drop(pub message.Publisher) {
	p.mu.Lock()
	if p.pub == pub {
		p.pub = nil
	}
	p.mu.Unlock()
	_ = closePublisher(pub)
}

// nackedPublish reports whether err is watermill-amqp's error for a publish
// the broker did not confirm (a nack; also a confirm lost with its
// channel).
func nackedPublish(err error) bool {
	return strings.HasPrefix(err.Error(), "delivery not confirmed for message")
}

// Close implements message.Publisher.
func (p *repoolingPublisher) Close() error {
	p.mu.Lock()
	pub := p.pub
	p.pub, p.closed = nil, true
	p.mu.Unlock()
	if pub == nil {
		return nil
	}
	return closePublisher(pub)
}

// lostPooledChannel reports whether err is watermill-amqp's error for a
// channel the pool could not hand out because reopening it failed, the
// case in which the channel is not returned to the pool. Its own closing
// ("provider is closed", "channel pool is closed") is not that case.
func lostPooledChannel(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "cannot open channel") &&
		!strings.Contains(msg, "provider is closed") && !strings.Contains(msg, "channel pool is closed")
}
