package postgres_test

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
)

var errHandler = errors.New("handler failed")

// failWith is a handler that always fails with err.
func failWith(err error) message.HandlerFunc {
	return func(*message.Message) ([]*message.Message, error) { return nil, err }
}

// succeed is a handler that succeeds and returns one message.
func succeed(msg *message.Message) ([]*message.Message, error) {
	return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
}
