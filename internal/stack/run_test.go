package stack

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestMergeArgs(t *testing.T) {
	tests := []struct {
		name    string
		a, b    []string
		want    []string
		wantErr string
	}{
		{"none", nil, nil, nil, ""},
		{"disjoint", []string{"-relay-poll-interval", "50ms"}, []string{"-max-retries", "1"},
			[]string{"-relay-poll-interval", "50ms", "-max-retries", "1"}, ""},
		{"same flag same value once", []string{"-queue-type", "quorum", "-relay-kind=watermill"},
			[]string{"--queue-type=quorum", "-consumer", "router"},
			[]string{"-queue-type", "quorum", "-relay-kind=watermill", "-consumer", "router"}, ""},
		{"later occurrence overrides", []string{"-batch", "4", "-prefetch", "8", "-batch", "2"}, []string{"-batch", "2"},
			[]string{"-prefetch", "8", "-batch", "2"}, ""},
		{"boolean flags", []string{"-relay=false"}, []string{"-relay=false", "-relay-notify=false"},
			[]string{"-relay=false", "-relay-notify=false"}, ""},
		{"conflict", []string{"-max-retries", "4"}, []string{"-max-retries", "1"}, nil,
			`-max-retries is "4" for orders and "1" for settlement`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := MergeArgs(tt.a, tt.b)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("MergeArgs(%q, %q) error %v, want %q", tt.a, tt.b, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("MergeArgs(%q, %q) = %q, %v; want %q", tt.a, tt.b, got, err, tt.want)
			}
		})
	}
}

func TestMonolithModeStartsBothTogether(t *testing.T) {
	s := &Stack{Config: Config{Monolith: true}}
	ctx := context.Background()
	for _, start := range []func(context.Context, ...string) (*Process, error){s.StartOrders, s.StartSettlement} {
		if _, err := start(ctx); !errors.Is(err, errMonolith) {
			t.Fatalf("before Start: %v, want %v", err, errMonolith)
		}
	}
	p := &Process{Name: MonolithCommand}
	s.Orders, s.Settlement = p, p
	for _, start := range []func(context.Context, ...string) (*Process, error){s.StartOrders, s.StartSettlement} {
		if got, err := start(ctx); err != nil || got != p {
			t.Fatalf("after Start: %v, %v; want the monolith process", got, err)
		}
		if _, err := start(ctx, "-relay=false"); !errors.Is(err, errMonolith) {
			t.Fatalf("with flags after Start: %v, want %v", err, errMonolith)
		}
	}
	if _, err := s.StartMonolith(ctx); err == nil {
		t.Fatal("second StartMonolith succeeded")
	}
	if ps := s.Processes(); len(ps) != 1 || ps[0] != p {
		t.Fatalf("Processes() = %v, want the one monolith process", ps)
	}
	if got := (Config{Monolith: true}).Commands(); !slices.Equal(got, []string{MonolithCommand}) {
		t.Fatalf("Commands() = %q", got)
	}
	if _, err := (&Stack{}).StartMonolith(ctx); err == nil || !strings.Contains(err.Error(), "not in monolith mode") {
		t.Fatalf("StartMonolith outside monolith mode: %v", err)
	}
}
