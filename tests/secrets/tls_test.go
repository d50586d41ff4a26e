package secrets_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/instance"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// unknownAuthority reports whether err is a certificate verification
// failure: the server's certificate is not signed by the CA given.
func unknownAuthority(err error) bool {
	var unknown x509.UnknownAuthorityError
	return errors.As(err, &unknown)
}

// withHost returns raw with its host name replaced by host, port kept.
func withHost(t *testing.T, raw, host string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host + ":" + u.Port()
	return u.String()
}

// TestTLS_Postgres checks that sslmode=verify-full with the CA that signed
// the server's certificate connects over TLS, by IP address and by name,
// and that another CA is refused.
func TestTLS_Postgres(t *testing.T) {
	t.Parallel()
	files, other := instance.NewTLSFiles(t), instance.NewTLSFiles(t)
	pg := instance.StartPostgres(t, instance.WithPostgresTLS(files))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sslInUse := func(t *testing.T, raw string) bool {
		t.Helper()
		db, err := postgres.Open(ctx, raw, 1)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer db.Close()
		var ssl bool
		if err := db.GetContext(ctx, &ssl, `SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`); err != nil {
			t.Fatal(err)
		}
		return ssl
	}
	t.Run("right CA", func(t *testing.T) {
		if !sslInUse(t, pg.TLSURL("postgres", files.CA)) {
			t.Error("connected without TLS")
		}
	})
	t.Run("by name", func(t *testing.T) {
		if !sslInUse(t, withHost(t, pg.TLSURL("postgres", files.CA), "localhost")) {
			t.Error("connected without TLS")
		}
	})
	t.Run("plain, for comparison", func(t *testing.T) {
		if sslInUse(t, pg.URL("postgres")) {
			t.Error("sslmode=disable connected with TLS: the check above proves nothing")
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		db, err := postgres.Open(ctx, pg.TLSURL("postgres", other.CA), 1)
		if err == nil {
			db.Close()
			t.Fatal("connected with a CA that did not sign the server's certificate")
		}
		if !unknownAuthority(err) {
			t.Errorf("error %v, want a certificate signed by an unknown authority", err)
		}
	})
}

// TestTLS_RabbitMQ checks that amqps:// with cacertfile connects with the
// CA that signed the node's certificate, through rabbitmq.Dial and through
// the Watermill publisher and subscriber configurations, a message going
// round, and that another CA is refused.
func TestTLS_RabbitMQ(t *testing.T) {
	t.Parallel()
	files, other := instance.NewTLSFiles(t), instance.NewTLSFiles(t)
	r := instance.StartRabbit(t, instance.WithRabbitTLS(files))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tlsURL := r.TLSURL(files.CA)

	t.Run("right CA", func(t *testing.T) {
		for _, raw := range []string{tlsURL, withHost(t, tlsURL, "localhost")} {
			conn, err := rabbitmq.Dial(ctx, raw)
			if err != nil {
				t.Fatalf("dial %s: %v", raw, err)
			}
			if state := conn.ConnectionState(); !state.HandshakeComplete {
				t.Errorf("dial %s: no TLS handshake", raw)
			}
			conn.Close()
		}
	})
	t.Run("wrong CA", func(t *testing.T) {
		conn, err := rabbitmq.Dial(ctx, r.TLSURL(other.CA))
		if err == nil {
			conn.Close()
			t.Fatal("connected with a CA that did not sign the node's certificate")
		}
		if !unknownAuthority(err) {
			t.Errorf("error %v, want a certificate signed by an unknown authority", err)
		}
		if _, err := wmamqp.NewPublisher(rabbitmq.PublisherConfig(r.TLSURL(other.CA), "x"), watermill.NopLogger{}); err == nil || !unknownAuthority(err) {
			t.Errorf("Watermill publisher: error %v, want a certificate signed by an unknown authority", err)
		}
	})
	t.Run("round trip", func(t *testing.T) {
		exchange, queue := "obm.tls.events", "obm.tls.queue"
		topology := rabbitmq.Topology{
			Exchanges: []string{exchange},
			Queues:    []rabbitmq.Queue{{Name: queue, Bindings: []rabbitmq.Binding{{Exchange: exchange, RoutingKey: "Checked"}}}},
		}
		if err := rabbitmq.Declare(ctx, tlsURL, topology); err != nil {
			t.Fatalf("declare: %v", err)
		}
		logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
		sub, err := wmamqp.NewSubscriber(rabbitmq.SubscriberConfig(tlsURL, 4), logger)
		if err != nil {
			t.Fatalf("subscriber: %v", err)
		}
		defer sub.Close()
		messages, err := sub.Subscribe(ctx, queue)
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
		pub, err := wmamqp.NewPublisher(rabbitmq.PublisherConfig(tlsURL, exchange), logger)
		if err != nil {
			t.Fatalf("publisher: %v", err)
		}
		defer pub.Close()
		sent := message.NewMessage(watermill.NewUUID(), []byte(`{"over":"tls"}`))
		if err := pub.Publish("Checked", sent); err != nil {
			t.Fatalf("publish: %v", err)
		}
		select {
		case got := <-messages:
			got.Ack()
			if got.UUID != sent.UUID || string(got.Payload) != string(sent.Payload) {
				t.Errorf("received %s %q, want %s %q", got.UUID, got.Payload, sent.UUID, sent.Payload)
			}
		case <-ctx.Done():
			t.Fatal("no message within a minute")
		}
	})
}

// TestTLS_Process runs the sample modules in one process over TLS to both
// servers, with passwords in both URLs (RabbitMQ's checked, PostgreSQL's
// ignored by trust authentication): it serves /readyz with 200, an order
// paid is settled (relay and consumers both ways over TLS), and its logs
// never show a password.
func TestTLS_Process(t *testing.T) {
	t.Parallel()
	files := instance.NewTLSFiles(t)
	pg := instance.StartPostgres(t, instance.WithPostgresTLS(files))
	r := instance.StartRabbit(t, instance.WithRabbitTLS(files))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := pg.Env().CreateDatabase(ctx, "obm_tls"); err != nil {
		t.Fatal(err)
	}
	r.Ctl(t, "add_user", "obm_app", pw)
	r.Ctl(t, "set_permissions", "-p", "/", "obm_app", ".*", ".*", ".*")

	dbURL, err := url.Parse(pg.TLSURL("obm_tls", files.CA))
	if err != nil {
		t.Fatal(err)
	}
	dbURL.User = url.UserPassword("postgres", pw)
	brokerURL, err := url.Parse(r.TLSURL(files.CA))
	if err != nil {
		t.Fatal(err)
	}
	brokerURL.User = url.UserPassword("obm_app", pw)

	var logs lockedBuffer
	p, err := module.New(ctx, modules.Samples(), module.Config{
		Run:         []string{"orders", "settlement"},
		DatabaseURL: dbURL.String(),
		AMQPURL:     brokerURL.String(),
		HTTPAddr:    "127.0.0.1:0",
		Namespace:   testenv.UniqueName("obm_tls_"),
		Logger:      slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatalf("new process: %v", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		if strings.Contains(logs.String(), pw) {
			t.Errorf("the logs show the password:\n%s", logs.String())
		} else if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	}()

	base := "http://" + p.Addr()
	client := &http.Client{Timeout: 10 * time.Second}
	waitFor(t, ctx, "/readyz 200", func() (bool, error) {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	})

	var order struct {
		ID      string `json:"id"`
		Settled bool   `json:"settled"`
	}
	post := func(path, body string) {
		t.Helper()
		resp, err := client.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s: status %d", path, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(&order); err != nil {
			t.Fatal(err)
		}
	}
	post("/orders", `{"customer_id":"tls-customer","amount":1200,"currency":"EUR"}`)
	post("/orders/"+order.ID+"/pay", `{"amount":1200}`)
	waitFor(t, ctx, "the paid order settled", func() (bool, error) {
		resp, err := client.Get(base + "/orders/" + order.ID)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&order); err != nil {
			return false, err
		}
		return order.Settled, nil
	})
}

// waitFor polls cond until it holds or ctx ends, failing t then with the
// last error cond gave.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v (last: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
