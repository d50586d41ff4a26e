// Package postgres holds Outboxmill's PostgreSQL adapters: connection set-up,
// embedded migrations, the order repository (business row and outbox rows in
// one transaction) and the settlement ledger.
package postgres
