package cli

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestEnv(t *testing.T) {
	t.Setenv("OUTBOXMILL_TEST_ENV", "")
	if got := Env("OUTBOXMILL_TEST_ENV", "def"); got != "def" {
		t.Errorf("empty: got %q, want the default", got)
	}
	t.Setenv("OUTBOXMILL_TEST_ENV", "set")
	if got := Env("OUTBOXMILL_TEST_ENV", "def"); got != "set" {
		t.Errorf("set: got %q, want set", got)
	}
}

func TestEnvBool(t *testing.T) {
	for _, tc := range []struct {
		value   string
		def     bool
		want    bool
		wantErr bool
	}{
		{"", true, true, false},
		{"", false, false, false},
		{"true", false, true, false},
		{"1", false, true, false},
		{"false", true, false, false},
		{"0", true, false, false},
		{"maybe", true, false, true},
		{"yes", true, false, true},
		{" true", true, false, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv("OUTBOXMILL_TEST_BOOL", tc.value)
			got, err := EnvBool("OUTBOXMILL_TEST_BOOL", tc.def)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "OUTBOXMILL_TEST_BOOL") || !strings.Contains(err.Error(), tc.value) {
					t.Errorf("got (%v, %v), want an error naming the variable and its value", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got (%v, %v), want %v", got, err, tc.want)
			}
		})
	}
}

func TestEnvDuration(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    time.Duration
		wantErr bool
	}{
		{"", 7 * time.Second, false},
		{"250ms", 250 * time.Millisecond, false},
		{"1m30s", 90 * time.Second, false},
		{"soon", 0, true},
		{"5", 0, true},
		{"5 s", 0, true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv("OUTBOXMILL_TEST_DURATION", tc.value)
			got, err := EnvDuration("OUTBOXMILL_TEST_DURATION", 7*time.Second)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "OUTBOXMILL_TEST_DURATION") {
					t.Errorf("got (%v, %v), want an error naming the variable", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got (%v, %v), want %v", got, err, tc.want)
			}
		})
	}
}

func TestNewLogger(t *testing.T) {
	for _, level := range []string{"debug", "info", "warn", "error", "INFO"} {
		if _, err := NewLogger(level, io.Discard); err != nil {
			t.Errorf("level %q: %v", level, err)
		}
	}
	for _, level := range []string{"", "loud", "trace"} {
		if _, err := NewLogger(level, io.Discard); err == nil {
			t.Errorf("level %q accepted", level)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		ok        bool
		code      int
		stderrHas string
	}{
		{"flags", []string{"-n", "3"}, true, 0, ""},
		{"help", []string{"-h"}, false, 0, "Usage of cmd"},
		{"unknown flag", []string{"-nope"}, false, 2, "flag provided but not defined: -nope"},
		{"bad value", []string{"-n", "three"}, false, 2, `invalid value "three" for flag -n`},
		{"positional argument", []string{"-n", "3", "extra"}, false, 2, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("cmd", flag.ContinueOnError)
			fs.Int("n", 0, "a number")
			var buf bytes.Buffer
			ok, code := Parse(fs, tc.args, &buf)
			stderr := buf.String()
			if ok != tc.ok || code != tc.code {
				t.Errorf("Parse = (%v, %d), want (%v, %d)", ok, code, tc.ok, tc.code)
			}
			if !strings.Contains(stderr, tc.stderrHas) || (tc.stderrHas == "") != (stderr == "") {
				t.Errorf("stderr %q, want it to say %q", stderr, tc.stderrHas)
			}
		})
	}
}
