package app

import "errors"

// ErrNotFound is returned when the requested aggregate does not exist.
var ErrNotFound = errors.New("not found")

// ErrVersionConflict is returned when an aggregate changed between being
// loaded and being saved (optimistic concurrency). Nothing was saved; the
// caller may reload and try again.
var ErrVersionConflict = errors.New("version conflict")
