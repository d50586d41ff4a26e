// Package secrets_test checks that the commands keep passwords to
// themselves, whatever the shape and source of the URLs they are given, and
// that TLS to PostgreSQL and RabbitMQ works by configuration alone.
package secrets_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// pw is the password of every URL the sweep gives the commands; nothing
// else a run sees contains it.
const pw = "Qx9swept"

// unreachableBroker is a broker URL nothing listens on.
const unreachableBroker = "amqp://guest:guest@127.0.0.1:1/"

// databaseShapes are database URLs holding pw: accepted by the server
// (trust authentication takes any password), refused, unreachable and
// malformed in the ways that make parsers quote them.
func databaseShapes(t *testing.T, db *testdb.DB) map[string]string {
	t.Helper()
	accepted, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	accepted.User = url.UserPassword(accepted.User.Username(), pw)
	unknown := *accepted
	unknown.User = url.UserPassword("obm_nobody", pw)
	return map[string]string{
		"accepted password":     accepted.String(),
		"unknown role":          unknown.String(),
		"unreachable":           "postgres://app:" + pw + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=2",
		"space":                 "postgres://app:" + pw + " x@127.0.0.1:1/db",
		"bad port":              "postgres://app:" + pw + "@127.0.0.1:port/db",
		"bad escape":            "postgres://app:" + pw + "%zz@127.0.0.1:1/db",
		"slash":                 "postgres://app:" + pw + "/x@127.0.0.1:1/db",
		"one slash":             "postgres:/app:" + pw + "@127.0.0.1:1/db",
		"two hosts, bad port":   "postgres://app:" + pw + "@127.0.0.1:1,127.0.0.1:x/db",
		"password in the query": "postgres://app@127.0.0.1:1/db?password=" + pw + "&sslmode=sometimes",
		"key=value":             "host=127.0.0.1 port=1 user=app password=" + pw + " dbname=db connect_timeout=2",
		"key = value, bad port": "host=127.0.0.1 port=x user=app password = " + pw + " dbname=db",
		"unterminated quote":    "host=127.0.0.1 port=1 user=app password='" + pw + " dbname=db",
	}
}

// brokerShapes are broker URLs holding pw: refused by the broker,
// unreachable and malformed.
func brokerShapes(t *testing.T) map[string]string {
	t.Helper()
	wrong, err := url.Parse(testenv.FromEnvironment().AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	wrong.User = url.UserPassword(wrong.User.Username(), pw)
	return map[string]string{
		"wrong password":    wrong.String(),
		"unreachable":       "amqp://app:" + pw + "@127.0.0.1:1/",
		"amqps unreachable": "amqps://app:" + pw + "@127.0.0.1:1/?cacertfile=/nonexistent/ca.crt",
		"space":             "amqp://app:" + pw + " x@127.0.0.1:1/",
		"bad port":          "amqp://app:" + pw + "@127.0.0.1:port/",
		"bad escape":        "amqp://app:" + pw + "%zz@127.0.0.1:1/",
		"slash":             "amqp://app:" + pw + "/x@127.0.0.1:1/",
		"quote":             `amqp://app:` + pw + `"q@127.0.0.1:port/`,
		"unknown scheme":    "amqq://app:" + pw + "@127.0.0.1:1/",
	}
}

// command is one of the commands swept, run in-process.
type command struct {
	name string
	// args come before the flags: a subcommand.
	args []string
	// outboxctl runs outboxctl.Main, the others module.Main.
	outboxctl bool
	// run is what the module command runs.
	run []string
	// module is the module whose own database variable is swept.
	module string
}

var commands = []command{
	{name: "orders", run: []string{"orders"}, module: "orders"},
	{name: "settlement", run: []string{"settlement"}, module: "settlement"},
	{name: "monolith", run: []string{"orders", "settlement"}, module: "orders"},
	{name: "orders migrate", args: []string{"migrate"}, run: []string{"orders"}, module: "orders"},
	{name: "outboxctl status", args: []string{"status"}, outboxctl: true, module: "settlement"},
	{name: "outboxctl unroutable list", args: []string{"unroutable", "list"}, outboxctl: true, module: "orders"},
}

// exec runs c with args after its own and returns its exit code and all it
// wrote, to stdout and stderr.
func (c command) exec(args []string) (int, string) {
	var out bytes.Buffer
	args = append(append([]string(nil), c.args...), args...)
	if c.outboxctl {
		code := outboxctl.Main(context.Background(), modules.Samples(), args, &out, &out)
		return code, out.String()
	}
	code := module.Main(module.Command{Name: c.name, Set: modules.Samples(), Run: c.run, HTTPAddr: "127.0.0.1:0"}, args, &out)
	return code, out.String()
}

// variable is a setting a URL is given in: its flag and its environment
// variable (and the variable's _FILE).
type variable struct{ flag, env string }

func databaseVariables(c command) []variable {
	own := strings.ToUpper(c.module) + "_DATABASE_URL"
	return []variable{{"-database-url", "DATABASE_URL"}, {"-" + c.module + "-database-url", own}}
}

var brokerVariable = variable{"-amqp-url", "AMQP_URL"}

// sources are the ways a URL reaches a command.
var sources = []string{"flag", "env", "file"}

// give sets value as v from source for the rest of t, and returns the
// arguments to pass.
func give(t *testing.T, v variable, source, value string) []string {
	t.Helper()
	switch source {
	case "flag":
		return []string{v.flag, value}
	case "env":
		t.Setenv(v.env, value)
	case "file":
		path := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Setenv(v.env, "")
		t.Setenv(v.env+"_FILE", path)
	}
	return nil
}

// baseEnv sets the environment every run starts from: the database and
// broker URLs given, every other URL variable empty, a free HTTP port and
// a namespace of the test's own.
func baseEnv(t *testing.T, databaseURL, brokerURL, namespace string) {
	t.Helper()
	t.Setenv("DATABASE_URL", databaseURL)
	t.Setenv("AMQP_URL", brokerURL)
	for _, name := range []string{"DATABASE_URL_FILE", "AMQP_URL_FILE", "ORDERS_DATABASE_URL", "ORDERS_DATABASE_URL_FILE",
		"SETTLEMENT_DATABASE_URL", "SETTLEMENT_DATABASE_URL_FILE", "MODULES", "MIGRATE", "RELAY", "RUNTIME_ROLE", "LOG_LEVEL"} {
		t.Setenv(name, "")
	}
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")
	t.Setenv("OUTBOXMILL_NAMESPACE", namespace)
}

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// captureDefaultLog sends the default logger to a buffer until t ends, so
// that a component falling back on it is swept too.
func captureDefaultLog(t *testing.T) *lockedBuffer {
	t.Helper()
	var buf lockedBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// TestShapes_AreHostile checks that the sweep's malformed URLs are ones
// that the parsers underneath quote, password included: without the
// commands' care, they would be printed.
func TestShapes_AreHostile(t *testing.T) {
	for _, raw := range []string{brokerShapes(t)["bad port"], brokerShapes(t)["slash"], brokerShapes(t)["bad escape"]} {
		if _, err := amqp.ParseURI(raw); err == nil || !strings.Contains(err.Error(), pw) {
			t.Errorf("amqp.ParseURI(%q) = %v, want an error quoting the password", raw, err)
		}
	}
	for _, raw := range []string{"postgres://app:" + pw + "@127.0.0.1:port/db", "postgres://app:" + pw + "%zz@127.0.0.1:1/db"} {
		if _, err := url.Parse(raw); err == nil || !strings.Contains(err.Error(), pw) {
			t.Errorf("url.Parse(%q) = %v, want an error quoting the password", raw, err)
		}
	}
}

// TestSweep_NoPasswordInOutput runs every command with a password in
// every URL shape, from every source, and checks that neither what it
// writes (stdout, stderr, logs) nor the default logger shows the password;
// -h included.
func TestSweep_NoPasswordInOutput(t *testing.T) {
	db := testdb.NewServices(t)
	defaultLog := captureDefaultLog(t)
	namespace := testenv.UniqueName("obm_secrets_")
	check := func(t *testing.T, c command, args []string, failing bool) {
		t.Helper()
		code, out := c.exec(args)
		if strings.Contains(out, pw) {
			t.Errorf("%s %q: the password is shown:\n%s", c.name, args, out)
		}
		if failing && (code == 0 || !strings.Contains(out, "database") && !strings.Contains(out, "broker")) {
			t.Errorf("%s %q: exit code %d, want a failure naming the database or the broker:\n%s", c.name, args, code, out)
		}
		code, out = c.exec(append(args, "-h"))
		if code != 0 || strings.Contains(out, pw) || !strings.Contains(out, "database-url") {
			t.Errorf("%s %q -h: exit code %d, want 0 and usage without the password:\n%s", c.name, args, code, out)
		}
	}
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			for _, v := range databaseVariables(c) {
				for shape, raw := range databaseShapes(t, db) {
					for _, source := range sources {
						t.Run(strings.Join([]string{v.env, shape, source}, "/"), func(t *testing.T) {
							baseEnv(t, db.URL, unreachableBroker, namespace)
							// outboxctl status reports an unreachable
							// broker without failing.
							failing := !(c.outboxctl && shape == "accepted password")
							check(t, c, give(t, v, source, raw), failing)
						})
					}
				}
			}
			for shape, raw := range brokerShapes(t) {
				for _, source := range sources {
					if shape == "wrong password" && source != "env" {
						continue // the broker answers a failed login after seconds: once per command
					}
					t.Run(strings.Join([]string{brokerVariable.env, shape, source}, "/"), func(t *testing.T) {
						baseEnv(t, db.URL, unreachableBroker, namespace)
						check(t, c, give(t, brokerVariable, source, raw), c.name != "outboxctl status")
					})
				}
			}
		})
	}
	if out := defaultLog.String(); strings.Contains(out, pw) {
		t.Errorf("the default logger shows the password:\n%s", out)
	}
}

// TestSecretFiles checks the _FILE variables: a URL from a file is used
// (its trailing newline dropped), a flag wins over it, and a variable set
// together with its _FILE or an unreadable file is a clear error that
// shows no content.
func TestSecretFiles(t *testing.T) {
	db := testdb.NewServices(t)
	namespace := testenv.UniqueName("obm_secrets_")
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	unreachableDB := "postgres://app:" + pw + "@127.0.0.1:1/db?sslmode=disable&connect_timeout=2"
	unreachable := write("unreachable", unreachableDB+"\n")
	good := write("good", db.URL+"\n")
	for _, c := range []command{commands[0], commands[4]} {
		for _, tc := range []struct {
			name string
			env  map[string]string
			args []string
			want []string
		}{
			{name: "file is read", env: map[string]string{"DATABASE_URL": "", "DATABASE_URL_FILE": unreachable},
				want: []string{"connect to database"}},
			{name: "flag wins over the file", env: map[string]string{"DATABASE_URL": "", "DATABASE_URL_FILE": good},
				args: []string{"-database-url", unreachableDB}, want: []string{"connect to database"}},
			{name: "variable and file", env: map[string]string{"DATABASE_URL": unreachableDB, "DATABASE_URL_FILE": good},
				want: []string{"DATABASE_URL and DATABASE_URL_FILE are both set"}},
			{name: "module variable and file", env: map[string]string{"ORDERS_DATABASE_URL": unreachableDB, "ORDERS_DATABASE_URL_FILE": good},
				want: []string{"ORDERS_DATABASE_URL and ORDERS_DATABASE_URL_FILE are both set"}},
			{name: "missing file", env: map[string]string{"AMQP_URL": "", "AMQP_URL_FILE": filepath.Join(dir, "missing")},
				want: []string{"AMQP_URL_FILE", "missing", "no such file"}},
			{name: "empty file", env: map[string]string{"AMQP_URL": "", "AMQP_URL_FILE": write("empty", "\n")},
				want: []string{"AMQP_URL_FILE", "empty"}},
			{name: "directory", env: map[string]string{"DATABASE_URL": "", "DATABASE_URL_FILE": dir},
				want: []string{"DATABASE_URL_FILE", "not a regular file"}},
		} {
			t.Run(c.name+"/"+tc.name, func(t *testing.T) {
				baseEnv(t, db.URL, unreachableBroker, namespace)
				for k, v := range tc.env {
					t.Setenv(k, v)
				}
				code, out := c.exec(tc.args)
				if code == 0 {
					t.Errorf("exit code 0, want a failure:\n%s", out)
				}
				for _, want := range tc.want {
					if !strings.Contains(out, want) {
						t.Errorf("output does not say %q:\n%s", want, out)
					}
				}
				if strings.Contains(out, pw) {
					t.Errorf("the password is shown:\n%s", out)
				}
			})
		}
	}
	t.Run("usage names the files", func(t *testing.T) {
		baseEnv(t, db.URL, unreachableBroker, namespace)
		_, out := commands[2].exec([]string{"-h"})
		for _, want := range []string{"DATABASE_URL_FILE", "AMQP_URL_FILE", "ORDERS_DATABASE_URL_FILE", "SETTLEMENT_DATABASE_URL_FILE"} {
			if !strings.Contains(out, want) {
				t.Errorf("usage does not name %s:\n%s", want, out)
			}
		}
	})
}
