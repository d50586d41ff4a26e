// Package cli holds what the commands share: reading settings from flags with
// defaults taken from the environment (connection strings also from files),
// keeping passwords out of what the commands print, logging set-up, and
// running a service until SIGINT or SIGTERM.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/outboxmill/outboxmill/adapters/retention"
)

// Default local services, used when neither a flag nor the environment says
// otherwise.
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// Env returns the environment variable name, or def when it is unset or empty.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// EnvDuration is Env for a duration; a malformed value is an error.
func EnvDuration(name string, def time.Duration) (time.Duration, error) {
	return envParsed(name, def, time.ParseDuration, "a duration such as 250ms or 1m30s")
}

// EnvBool is Env for a boolean (true/false, 1/0); a malformed value is an
// error.
func EnvBool(name string, def bool) (bool, error) {
	return envParsed(name, def, strconv.ParseBool, "true or false")
}

// EnvInt is Env for a whole number; a malformed value is an error. Its
// range is the caller's to check.
func EnvInt(name string, def int) (int, error) {
	return envParsed(name, def, strconv.Atoi, "a whole number")
}

// envParsed returns the environment variable name parsed by parse, or def
// when it is unset or empty. A malformed value's error says what was
// wanted and quotes the value (%q, not the parser's message, which leaves
// DEL unescaped).
func envParsed[T any](name string, def T, parse func(string) (T, error), want string) (T, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	x, err := parse(v)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: want %s, got %q", name, want, v)
	}
	return x, nil
}

// NewLogger returns a text logger writing to w at the named level (debug,
// info, warn, error).
func NewLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// SignalContext returns a context cancelled on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Parse parses args with fs and rejects positional arguments. It prints
// usage and errors to stderr and returns the exit code to use when it fails
// (0 for -h).
func Parse(fs *flag.FlagSet, args []string, stderr io.Writer) (ok bool, code int) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return false, 0
		}
		return false, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		fs.Usage()
		return false, 2
	}
	return true, 0
}

// Fail prints err for the command named cmd to stderr and returns exit code
// 1.
func Fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	return 1
}

// SecretURL is a flag.Value holding a connection URL. It prints with its
// passwords hidden (Redact), so that -h and error messages never show a
// secret taken from the environment or a file.
type SecretURL struct{ url *string }

// NewSecretURL returns a SecretURL storing into target, which holds the
// default.
func NewSecretURL(target *string) *SecretURL { return &SecretURL{url: target} }

// Set implements flag.Value.
func (s *SecretURL) Set(v string) error { *s.url = v; return nil }

// String implements flag.Value.
func (s *SecretURL) String() string {
	if s == nil || s.url == nil {
		return ""
	}
	return Redact(*s.url)
}

// RetentionFlags defines the retention policy's flags on fs, writing into
// cfg, with defaults from OUTBOX_RETENTION, DEDUP_WINDOW and
// RETENTION_INTERVAL; a malformed variable is an error. The ranges its
// usage states are the ones module.Config.Validate checks.
func RetentionFlags(fs *flag.FlagSet, cfg *retention.Config) error {
	outboxRetention, err := EnvDuration("OUTBOX_RETENTION", retention.DefaultOutboxRetention)
	if err != nil {
		return err
	}
	dedupWindow, err := EnvDuration("DEDUP_WINDOW", retention.DefaultDedupWindow)
	if err != nil {
		return err
	}
	interval, err := EnvDuration("RETENTION_INTERVAL", retention.DefaultInterval)
	if err != nil {
		return err
	}
	fs.DurationVar(&cfg.OutboxRetention, "outbox-retention", outboxRetention, "how long forwarded outbox rows are kept, 1m..87600h (env OUTBOX_RETENTION)")
	fs.DurationVar(&cfg.DedupWindow, "dedup-window", dedupWindow, "how long dedup markers are kept, 1m..87600h; must exceed -outbox-retention and the broker's redelivery horizon (env DEDUP_WINDOW)")
	fs.DurationVar(&cfg.Interval, "retention-interval", interval, "how often retention purges run, 1s..720h (env RETENTION_INTERVAL)")
	return nil
}
