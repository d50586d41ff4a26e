package middleware

import (
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill/message"
)

// PanicError is the error Recoverer returns for a handler that panicked.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Recoverer turns a panic in h into a *PanicError, so that the message is
// retried or set aside like any other failure instead of killing the process.
func Recoverer(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (out []*message.Message, err error) {
		defer func() {
			if r := recover(); r != nil {
				out, err = nil, &PanicError{Value: r, Stack: string(debug.Stack())}
			}
		}()
		return h(msg)
	}
}
