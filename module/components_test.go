package module

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestRunComponents(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var stopped []string
	record := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		stopped = append(stopped, name)
	}
	blockUntilCancelled := func(name string) Component {
		return Component{Name: name, Run: func(ctx context.Context) error {
			<-ctx.Done()
			record(name)
			return nil
		}}
	}

	t.Run("stops in reverse order when the context ends", func(t *testing.T) {
		stopped = nil
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := RunComponents(ctx, slog.Default(), 5*time.Second,
			blockUntilCancelled("first"), blockUntilCancelled("second"), blockUntilCancelled("third"))
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"third", "second", "first"}; !slices.Equal(stopped, want) {
			t.Fatalf("stopped %v, want %v", stopped, want)
		}
	})

	t.Run("a failing component stops the others and its error is returned", func(t *testing.T) {
		stopped = nil
		boom := errors.New("boom")
		err := RunComponents(context.Background(), slog.Default(), 5*time.Second,
			blockUntilCancelled("worker"),
			Component{Name: "failing", Run: func(context.Context) error { return boom }})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want %v", err, boom)
		}
		if !slices.Equal(stopped, []string{"worker"}) {
			t.Fatalf("stopped %v", stopped)
		}
	})

	t.Run("Stop is called before the context is cancelled", func(t *testing.T) {
		stopCalled := make(chan struct{})
		c := Component{
			Name: "graceful",
			Run: func(ctx context.Context) error {
				select {
				case <-stopCalled:
					return nil
				case <-ctx.Done():
					return errors.New("cancelled before Stop")
				}
			},
			Stop: func(context.Context) error { close(stopCalled); return nil },
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := RunComponents(ctx, slog.Default(), 5*time.Second, c); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a component that does not stop in time is reported", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		stuck := Component{Name: "stuck", Run: func(context.Context) error { <-release; return nil }}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := RunComponents(ctx, slog.Default(), 50*time.Millisecond, stuck)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want a deadline error", err)
		}
	})
}
