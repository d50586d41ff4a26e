package app

import "errors"

// ErrNotFound is returned when the requested aggregate does not exist.
var ErrNotFound = errors.New("not found")

// ErrVersionConflict is returned when an aggregate changed between being
// loaded and being saved (optimistic concurrency). Nothing was saved; the
// caller may reload and try again.
var ErrVersionConflict = errors.New("version conflict")

// ErrIdempotencyKeyReused is returned when an idempotency key is presented
// again with a request that differs from the one it was first used with.
var ErrIdempotencyKeyReused = errors.New("idempotency key reused with a different request")

// ErrIdempotencyKeyTaken is returned by OrderRepository.Add when another
// order already holds the idempotency key. The use case then answers with
// that order.
var ErrIdempotencyKeyTaken = errors.New("idempotency key already used")
