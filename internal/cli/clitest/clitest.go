// Package clitest runs a command's run(args, stderr) function the way the
// commands' tests need it: with a table of arguments and environment, and
// checks of the exit code and of what the command wrote to stderr.
package clitest

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// Unreachable servers: ports nobody listens on.
const (
	UnreachableDatabase = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"
	UnreachableBroker   = "amqp://guest:guest@127.0.0.1:1/"
)

// RunFunc is a command's entry point: it runs with args, writes usage,
// errors and logs to stderr and returns the exit code.
type RunFunc func(args []string, stderr io.Writer) int

// Case is one run of a command and what it must end with.
type Case struct {
	Name string
	Args []string
	// Env is set for the run, after the defaults of Run.
	Env  map[string]string
	Code int
	// StderrHas is what the command must say.
	StderrHas []string
}

// Capture runs run with args and returns its exit code and what it wrote to
// stderr.
func Capture(run RunFunc, args ...string) (int, string) {
	var stderr bytes.Buffer
	code := run(args, &stderr)
	return code, stderr.String()
}

// Run runs every case as a subtest. Each starts with DATABASE_URL and
// AMQP_URL on unreachable servers, HTTP_ADDR on a free port and the
// variables of cleared empty, so that a case that gets past its error fails
// fast instead of serving on the default database and address.
func Run(t *testing.T, run RunFunc, cleared []string, cases []Case) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", UnreachableDatabase)
			t.Setenv("AMQP_URL", UnreachableBroker)
			t.Setenv("HTTP_ADDR", "127.0.0.1:0")
			for _, name := range cleared {
				t.Setenv(name, "")
			}
			for k, v := range tc.Env {
				t.Setenv(k, v)
			}
			code, stderr := Capture(run, tc.Args...)
			if code != tc.Code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tc.Code, stderr)
			}
			for _, want := range tc.StderrHas {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}
