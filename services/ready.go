package services

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/handlers/httpapi"
)

// ReadyChecks are the readiness checks of a service that uses db and the
// broker at amqpURL: a database round trip, and a fresh broker connection.
func ReadyChecks(db *sqlx.DB, amqpURL string) []httpapi.Check {
	return []httpapi.Check{
		{Name: "database", Check: db.PingContext},
		{Name: "broker", Check: func(ctx context.Context) error {
			conn, err := rabbitmq.Dial(ctx, amqpURL)
			if err != nil {
				return err
			}
			return conn.Close()
		}},
	}
}
