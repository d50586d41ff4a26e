package orders_test

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	orderstore "github.com/outboxmill/outboxmill/adapters/orders"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules/orders"
)

// parse defines the flags of a fresh orders module and parses args.
func parse(t *testing.T, args ...string) (module.Module, error) {
	t.Helper()
	m := orders.Module()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := module.DefineFlags(fs, module.Set{m}); err != nil {
		return m, err
	}
	return m, fs.Parse(args)
}

func keep(m module.Module) time.Duration { return m.Retention()[0].Keep }

func TestModule_IdempotencyKeyWindow(t *testing.T) {
	t.Setenv(orders.WindowEnv, "")
	if m := orders.Module(); keep(m) != orderstore.DefaultIdempotencyWindow {
		t.Fatalf("without flags: keep %s, want the default", keep(m))
	}
	m, err := parse(t, "-idempotency-key-window", "2h")
	if err != nil || keep(m) != 2*time.Hour {
		t.Fatalf("-idempotency-key-window 2h: keep %s, %v", keep(m), err)
	}
	if r := m.Retention()[0]; r.Table != orderstore.IdempotencyKeysTable || r.Validate() != nil {
		t.Fatalf("rule %+v", r)
	}
	for _, bad := range []string{"0", "-1h", "30s", "800h", "soon"} {
		if _, err := parse(t, "-idempotency-key-window", bad); err == nil {
			t.Errorf("-idempotency-key-window %s: accepted", bad)
		}
	}
	t.Setenv(orders.WindowEnv, "48h")
	if m, err := parse(t); err != nil || keep(m) != 48*time.Hour {
		t.Fatalf("%s=48h: keep %s, %v", orders.WindowEnv, keep(m), err)
	}
	for _, bad := range []string{"soon", "0s", "1000h"} {
		t.Setenv(orders.WindowEnv, bad)
		if _, err := parse(t); err == nil || !strings.Contains(err.Error(), orders.WindowEnv) {
			t.Errorf("%s=%s: %v, want an error naming the variable", orders.WindowEnv, bad, err)
		}
	}
}

func TestDefineFlags_RefusesAClash(t *testing.T) {
	t.Setenv(orders.WindowEnv, "")
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	err := module.DefineFlags(fs, module.Set{orders.Module(), orders.Module()})
	if err == nil || !strings.Contains(err.Error(), "flag -idempotency-key-window is already defined") {
		t.Fatalf("two modules defining one flag: %v", err)
	}
}
