package postgres_test

import (
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

var errHandler = errors.New("handler failed")

// recorder is a handler that fails a given number of times, recording when
// it was called.
type recorder struct {
	// failures is how many calls fail before one succeeds; negative: all.
	failures int
	// err is the error of a failing call; default errHandler.
	err error
	// onCall, when set, runs at each call.
	onCall func(call int)

	mu    sync.Mutex
	calls []time.Time
}

func (r *recorder) handle(msg *message.Message) ([]*message.Message, error) {
	r.mu.Lock()
	r.calls = append(r.calls, time.Now())
	n := len(r.calls)
	r.mu.Unlock()
	if r.onCall != nil {
		r.onCall(n)
	}
	if r.failures < 0 || n <= r.failures {
		if r.err != nil {
			return nil, r.err
		}
		return nil, errHandler
	}
	return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
}

func (r *recorder) callTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.calls...)
}
