package module

import (
	"time"

	"github.com/outboxmill/outboxmill/internal/cli"
)

// The helpers below read a module's own settings from the environment in
// its Flags function, as Main reads the framework's: the variable, when set
// and not empty, is the default of the module's flag, and a malformed value
// is an error that names the variable, so that the command stops with a
// message instead of running with another value than the one it was given.

// Env returns the environment variable name, or def when it is unset or
// empty.
func Env(name, def string) string { return cli.Env(name, def) }

// EnvDuration is Env for a duration ("250ms", "1m30s").
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	return cli.EnvDuration(name, def)
}

// EnvBool is Env for a boolean (true/false, 1/0).
func EnvBool(name string, def bool) (bool, error) { return cli.EnvBool(name, def) }

// EnvInt is Env for a whole number; its range is the caller's to check.
func EnvInt(name string, def int) (int, error) { return cli.EnvInt(name, def) }
