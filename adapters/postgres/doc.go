// Package postgres holds the framework's PostgreSQL adapters: connection
// set-up (Open), migrations (Migrate, and the framework's own tables through
// MigrateFramework), the unit of work that commits a change and the events
// it returns in one transaction (UnitOfWork), the consumer's dedup markers
// (Dedup), the aggregate-version guard (VersionGuard), set-aside stores, and
// the classification of transient errors.
//
// It knows no module: each module's repositories live in its own adapters
// package (adapters/orders, adapters/settlement) and go through UnitOfWork.
package postgres
