// Package app holds what every module's use cases share: the errors a
// repository reports (ErrNotFound, ErrVersionConflict) and CommitListener,
// told after a commit that wrote events. It depends on the standard library
// only.
//
// A module keeps its use cases and the ports they need in a subpackage named
// after it (app/orders); adapters implement the ports, and their
// transactions go through the framework's unit of work
// (adapters/postgres.UnitOfWork), which writes the events a change returns
// in the same transaction.
package app
