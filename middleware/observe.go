package middleware

import "github.com/ThreeDotsLabs/watermill/message"

// Observe returns a middleware that calls done with each message and the
// error h returned for it, after h returns. Placed outermost, a non-nil
// error means the message is nacked and will be redelivered; metrics count
// it as a failure.
func Observe(done func(msg *message.Message, err error)) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			done(msg, err)
			return out, err
		}
	}
}
