package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/domain/orders"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	ordersmodule "github.com/outboxmill/outboxmill/modules/orders"
	"github.com/outboxmill/outboxmill/outboxtest"
)

// waitTimeout bounds every wait of these tests.
const waitTimeout = 60 * time.Second

// TestRun_PrintsEveryOrderPlaced runs the command against the orders module
// run with its defaults, twice at once (declaring the exchange, and only
// binding to it), and places orders: each run prints every OrderPlaced
// event once, with its id as Watermill's UUID, its metadata and payload.
func TestRun_PrintsEveryOrderPlaced(t *testing.T) {
	t.Parallel()
	db := outboxtest.NewDB(t, modules.Samples()...)
	app := outboxtest.Start(t, outboxtest.App{Set: modules.Samples(), Run: []string{ordersmodule.Name}, DB: db})
	watch := db.Watch(t, ordersmodule.Module())
	const placed = 3
	outputs := map[string]<-chan string{}
	for _, declare := range []bool{true, false} {
		queue := testenv.UniqueName("plainwatermill.")
		deleteQueueAtEnd(t, queue)
		outputs["-declare-exchange="+strconv.FormatBool(declare)] = start(t, []string{
			"-amqp-url", testenv.FromEnvironment().AMQPURL, "-namespace", app.Namespace(), "-queue", queue,
			"-count", strconv.Itoa(placed), "-declare-exchange=" + strconv.FormatBool(declare),
		})
	}
	for name, lines := range outputs {
		if got, want := next(t, lines), "queue "; !strings.HasPrefix(got, want) {
			t.Fatalf("%s: first line %q, want the queue bound", name, got)
		}
	}
	for i := range placed {
		post(t, app.URL()+"/orders", map[string]any{"customer_id": "c-" + strconv.Itoa(i), "amount": 1250 + i, "currency": "EUR"})
	}
	var want []string
	for _, ev := range watch.Events(t) {
		if ev.Type != orders.EventOrderPlaced {
			continue
		}
		payload, err := json.Marshal(ev.Payload)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, ev.ID+" "+ev.Type+" "+ev.AggregateID+" v"+strconv.Itoa(ev.AggregateVersion)+
			" occurred_at="+ev.OccurredAt.Format(time.RFC3339Nano)+" payload="+string(payload))
	}
	if len(want) != placed {
		t.Fatalf("%d OrderPlaced events committed, want %d", len(want), placed)
	}
	for name, lines := range outputs {
		var got []string
		for range placed {
			got = append(got, next(t, lines))
		}
		for _, w := range want {
			n := 0
			for _, g := range got {
				if g == w {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s printed %q %d times, want once; it printed:\n%s", name, w, n, strings.Join(got, "\n"))
			}
		}
		select {
		case line, ok := <-lines:
			if ok {
				t.Errorf("%s printed more than %d events: %q", name, placed, line)
			}
		case <-time.After(waitTimeout):
			t.Errorf("%s did not stop within %s of printing %d events", name, waitTimeout, placed)
		}
	}
}

// start runs the command with args until it returns, and returns the
// lines it prints; the channel is closed when it has returned, without
// error (an error fails t).
func start(t *testing.T, args []string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := run(ctx, args, w)
		if err != nil {
			t.Errorf("run %s: %v", strings.Join(args, " "), err)
		}
		_ = w.CloseWithError(err)
	}()
	t.Cleanup(func() {
		cancel()
		_ = r.Close()
		<-done
	})
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return lines
}

// next returns the next line of lines, failing t after waitTimeout.
func next(t *testing.T, lines <-chan string) string {
	t.Helper()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatal("the command stopped")
		}
		return line
	case <-time.After(waitTimeout):
		t.Fatalf("the command printed nothing within %s", waitTimeout)
	}
	return ""
}

// post sends a JSON request to the orders API, failing t unless it is
// created.
func post(t *testing.T, url string, body any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: status %d: %s", url, resp.StatusCode, data)
	}
}

// deleteQueueAtEnd deletes queue from the test broker when t ends.
func deleteQueueAtEnd(t *testing.T, queue string) {
	t.Cleanup(func() {
		conn, err := amqp091.Dial(testenv.FromEnvironment().AMQPURL)
		if err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
			return
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(queue, false, false, false)
		}
		if err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
		}
	})
}

// TestSubscriberConfig_DeclaresTheModulesExchange subscribes to the orders
// module's exchange, declared as the migrate command declares it, with
// Watermill's subscriber: declaring the exchange without its
// alternate-exchange argument is refused by the broker with
// PRECONDITION_FAILED; with it, or without declaring the exchange at all,
// the subscriber binds its queue. Binding without declaring needs the
// exchange to exist (NOT_FOUND otherwise).
func TestSubscriberConfig_DeclaresTheModulesExchange(t *testing.T) {
	t.Parallel()
	url := testenv.FromEnvironment().AMQPURL
	names := module.Names{Namespace: testenv.UniqueName("plainwatermill.")}
	topology, err := modules.Samples().Topology(names, rabbitmq.QueueClassic)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := rabbitmq.Declare(ctx, url, topology); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if err := rabbitmq.Delete(ctx, url, topology); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	if got, want := topology.AlternateExchange(), names.Namespace+".unroutable"; got != want {
		t.Fatalf("the exchanges' alternate exchange is %q, the config says %q", got, want)
	}

	for _, c := range []struct {
		name      string
		namespace string
		declare   bool
		arguments bool
		code      int // the AMQP error the subscription fails with; 0: none
	}{
		{name: "WithTheArgument", namespace: names.Namespace, declare: true, arguments: true},
		{name: "WithoutTheArgument", namespace: names.Namespace, declare: true, code: amqp091.PreconditionFailed},
		{name: "WithoutDeclaringIt", namespace: names.Namespace},
		{name: "WithoutDeclaringItBeforeItExists", namespace: names.Namespace + "-none", code: amqp091.NotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			queue := testenv.UniqueName("plainwatermill.")
			deleteQueueAtEnd(t, queue)
			config := subscriberConfig(url, c.namespace, queue, c.declare)
			if !c.arguments {
				config.Exchange.Arguments = nil
			}
			sub, err := amqp.NewSubscriber(config, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err = sub.Subscribe(ctx, pattern)
			var amqpErr *amqp091.Error
			switch {
			case c.code == 0 && err != nil:
				t.Fatalf("subscribe: %v", err)
			case c.code == 0:
			case !errors.As(err, &amqpErr) || amqpErr.Code != c.code:
				t.Fatalf("subscribe: %v, want AMQP error %d", err, c.code)
			default:
				t.Logf("refused as it should be: %v", err)
			}
		})
	}
}

// TestMain_ImportsOnlyWatermillAndAMQP keeps the command a consumer that
// runs no Outboxmill code: main.go imports the standard library, Watermill,
// watermill-amqp and amqp091-go, nothing else.
func TestMain_ImportsOnlyWatermillAndAMQP(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{"github.com/ThreeDotsLabs/watermill", "github.com/ThreeDotsLabs/watermill-amqp/v3", "github.com/rabbitmq/amqp091-go"}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		first, _, _ := strings.Cut(path, "/")
		if !strings.Contains(first, ".") {
			continue // the standard library
		}
		ok := false
		for _, a := range allowed {
			if path == a || strings.HasPrefix(path, a+"/") {
				ok = true
			}
		}
		if !ok {
			t.Errorf("main.go imports %s: a plain Watermill consumer imports only Watermill, watermill-amqp and amqp091-go", path)
		}
	}
}
