package tests

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	orderhandlers "github.com/outboxmill/outboxmill/handlers/orders"
	"github.com/outboxmill/outboxmill/internal/stack"
	"github.com/outboxmill/outboxmill/module"
)

// TestLeastPrivilege_ServicesRunWithRuntimeRoles runs the samples as in
// production: migrated by a migrator role, then run with -migrate=false
// under a runtime role per module and a broker user per service. Orders
// settle as usual, and each role and user is refused what it must not do.
func TestLeastPrivilege_ServicesRunWithRuntimeRoles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		monolith, shared bool
		cdc              bool
	}{
		{"services in their own databases", false, false, false},
		{"monolith in one database", true, true, false},
		// The cdc relay needs REPLICATION on top, and nothing else.
		{"services with the cdc relay", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := stack.Config{LeastPrivilege: true, Monolith: tc.monolith, SharedDatabase: tc.shared, OrdersArgs: fastRelay}
			if tc.cdc {
				cfg.OrdersArgs = append(slices.Clone(fastRelay), "-relay-kind", "cdc")
				cfg.RelayReplication = true
			}
			s := newStack(t, cfg)
			start(t, s)
			c := stack.NewClient()
			const n = 40
			placeAndPay(t, c, s.Orders.URL(), n)
			if books := waitSettled(t, s, n, settleTimeout); !books.RoundTripOK() || books.Settled != n {
				t.Fatalf("books: %v", books)
			}

			ordersURL, ordersAMQP := s.ServiceURLs("orders")
			settleURL, settleAMQP := s.ServiceURLs("settlement")
			if tc.cdc {
				// The orders went through the slot, streamed by the runtime role.
				var streaming int
				if err := execAs(t, stack.EnvFromEnvironment().AdminDatabaseURL, `
					SELECT count(*) FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
					WHERE s.database = '`+s.OrdersDB+`' AND a.usename = '`+user(t, ordersURL)+`'`, &streaming); err != nil || streaming != 1 {
					t.Errorf("%d slots of %s streamed by %s (%v), want 1", streaming, s.OrdersDB, user(t, ordersURL), err)
				}
			}
			// The services really run as the runtime roles.
			for _, url := range []string{ordersURL, settleURL} {
				var sessions int
				if err := execAs(t, stack.EnvFromEnvironment().AdminDatabaseURL,
					`SELECT count(*) FROM pg_stat_activity WHERE usename = '`+user(t, url)+`'`, &sessions); err != nil || sessions == 0 {
					t.Errorf("%d sessions of %s (%v): the services do not run as it", sessions, user(t, url), err)
				}
			}
			// Neither runtime role may change the schema, of its own tables
			// or any.
			for url, table := range map[string]string{ordersURL: "orders", settleURL: "settlements"} {
				for _, sql := range []string{
					"DROP TABLE " + table,
					"ALTER TABLE " + table + " ADD COLUMN intruder INT",
					"TRUNCATE " + table,
					"CREATE TABLE intruder (x INT)",
					"DROP TABLE processed_events",
				} {
					if err := execAs(t, url, sql); !insufficientPrivilege(err) {
						t.Errorf("%s as %s: %v, want insufficient_privilege (42501)", sql, user(t, url), err)
					}
				}
				// It may read and write its own tables.
				if err := execAs(t, url, "SELECT count(*) FROM "+table); err != nil {
					t.Errorf("reading %s as its runtime role: %v", table, err)
				}
			}
			// settlement's role cannot touch orders' tables: in a database of
			// its own it cannot even connect to orders'.
			for _, sql := range []string{"SELECT count(*) FROM orders", "DELETE FROM orders", "SELECT count(*) FROM watermill_orders_outbox"} {
				ordersDB, _ := s.ServiceURLs("orders")
				crossURL := settleURL
				if !tc.shared {
					crossURL = strings.Replace(ordersDB, user(t, ordersDB), user(t, settleURL), 1)
				}
				if err := execAs(t, crossURL, sql); !insufficientPrivilege(err) {
					t.Errorf("%s as settlement's role: %v, want insufficient_privilege (42501)", sql, err)
				}
			}

			if tc.monolith {
				return // one broker user runs both modules
			}
			names := module.Names{Namespace: s.Namespace}
			// settlement's broker user cannot publish to the orders events
			// exchange, nor read orders' queue; orders' cannot publish to
			// settlement's exchange.
			for _, probe := range []struct {
				url, what string
				try       func(*amqp.Channel) error
			}{
				{settleAMQP, "settlement publishing to " + names.Exchange("orders"), publishTo(names.Exchange("orders"), "OrderPaid.1")},
				{ordersAMQP, "orders publishing to " + names.Exchange("settlement"), publishTo(names.Exchange("settlement"), "SettlementRecorded.1")},
				{settleAMQP, "settlement consuming orders' queue", consumeFrom(names.Queue(orderhandlers.SettledHandlerName, 0))},
				{ordersAMQP, "orders declaring a queue", func(ch *amqp.Channel) error {
					_, err := ch.QueueDeclare(s.Namespace+".intruder", false, true, false, false, nil)
					return err
				}},
			} {
				if err := probe.try(brokerChannel(t, probe.url)); !accessRefused(err) {
					t.Errorf("%s: %v, want ACCESS_REFUSED (403)", probe.what, err)
				}
			}
			// The same probe with the orders user on its own exchange is
			// accepted: the refusals above are about permissions.
			if err := publishTo(names.Exchange("orders"), "Probe.1")(brokerChannel(t, ordersAMQP)); err != nil {
				t.Errorf("orders publishing to its own exchange: %v", err)
			}
		})
	}
}

// TestLeastPrivilege_ServiceRefusesAnUnmigratedDatabase starts orders with
// -migrate=false on a database nobody migrated: it must refuse, naming the
// migrate command, and create nothing.
func TestLeastPrivilege_ServiceRefusesAnUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	env := stack.EnvFromEnvironment()
	ctx := context.Background()
	db := stack.UniqueName("obm_unmigrated_")
	if err := env.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.DropDatabase(context.Background(), db) })
	ns := stack.UniqueName("obm_unmigrated_")
	cmd := exec.Command(filepath.Join(binDir, "orders"), "-migrate=false", "-http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+env.DatabaseURL(db), "AMQP_URL="+env.AMQPURL, "OUTBOXMILL_NAMESPACE="+ns)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("orders -migrate=false on an empty database: %v, want exit 1\n%s", err, stderr.String())
	}
	for _, want := range []string{"run the migrate command", "migration outboxmill/001_framework.sql", "migration orders/001_orders.sql", "outbox orders_outbox"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
		}
	}
	var tables int
	if err := execAs(t, env.DatabaseURL(db), `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`, &tables); err != nil || tables != 0 {
		t.Errorf("%d tables in the database afterwards (%v), want none", tables, err)
	}
	// Nor did it declare its topology.
	conn, err := rabbitmq.Dial(ctx, env.AMQPURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclarePassive(module.Names{Namespace: ns}.Exchange("orders"), "topic", true, false, false, false, nil); err == nil {
		t.Error("the orders exchange exists: the service declared it")
	}
}

// execAs runs sql on the database at url, as its user, scanning the row it
// returns into dest when dest is given.
func execAs(t *testing.T, url, sql string, dest ...any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if len(dest) > 0 {
		return conn.QueryRow(ctx, sql).Scan(dest...)
	}
	_, err = conn.Exec(ctx, sql)
	return err
}

func insufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// user returns the user of a PostgreSQL URL.
func user(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.User
}

// brokerChannel opens a channel on a connection of its own as the user of
// url, closed when t ends.
func brokerChannel(t *testing.T, url string) *amqp.Channel {
	t.Helper()
	conn, err := rabbitmq.Dial(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// publishTo publishes one message to exchange with a confirm; the broker
// answers a publish it does not permit by closing the channel.
func publishTo(exchange, key string) func(*amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		if err := ch.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, amqp.Publishing{Body: []byte("{}")})
		if err != nil {
			return err
		}
		select {
		case <-dc.Done():
			if dc.Acked() {
				return nil
			}
			// A refused publish closes the channel, which also ends the
			// confirm: the close tells why.
			select {
			case err := <-closed:
				return err
			case <-ctx.Done():
				return errors.New("nacked")
			}
		case err := <-closed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func consumeFrom(queue string) func(*amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, err := ch.Consume(queue, "", false, false, false, false, nil)
		return err
	}
}

func accessRefused(err error) bool {
	var amqpErr *amqp.Error
	return errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused
}

// TestLeastPrivilege_Script runs scripts/least-privilege.sh as a user would
// (with names of its own), starts both services with the URL files it
// wrote and -migrate=false, and settles an order through them. Running the
// script again rotates the passwords: the old broker password is refused.
func TestLeastPrivilege_Script(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := stack.EnvFromEnvironment()
	root, err := stack.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	prefix := stack.UniqueName("lp_")[:15] + "_"
	ns := strings.ReplaceAll(prefix, "_", "-") + "ns"
	secrets := t.TempDir()
	t.Cleanup(func() {
		ctx := context.Background()
		for _, m := range []string{"orders", "settlement"} {
			if err := env.DropDatabase(ctx, prefix+m); err != nil {
				t.Errorf("drop database: %v", err)
			}
		}
		for _, role := range []string{"migrator", "orders_app", "settlement_app"} {
			if err := env.Exec(ctx, "", `DROP ROLE IF EXISTS `+pgx.Identifier{prefix + role}.Sanitize()); err != nil {
				t.Errorf("drop role: %v", err)
			}
		}
		for _, m := range []string{"orders", "settlement"} {
			if out, err := exec.Command("rabbitmqctl", "-q", "delete_user", prefix+m).CombinedOutput(); err != nil {
				t.Errorf("delete broker user %s: %v\n%s", prefix+m, err, out)
			}
		}
		if err := stack.DeleteBrokerObjects(ctx, env, ns); err != nil {
			t.Errorf("delete broker objects: %v", err)
		}
	})
	runScript := func() {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "scripts", "least-privilege.sh"))
		cmd.Env = append(os.Environ(), "PREFIX="+prefix, "NAMESPACE="+ns, "SECRETS_DIR="+secrets, "BIN_DIR="+binDir,
			"ADMIN_DATABASE_URL="+env.AdminDatabaseURL, "AMQP_ADMIN_URL="+env.AMQPURL)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("least-privilege.sh: %v\n%s", err, out)
		}
	}
	runScript()
	oldAMQP, err := os.ReadFile(filepath.Join(secrets, "orders.amqp-url"))
	if err != nil {
		t.Fatal(err)
	}

	start := func(module string) *stack.Process {
		t.Helper()
		p, err := stack.Start(ctx, filepath.Join(binDir, module), []string{"-relay-poll-interval", "50ms"}, []string{
			"MIGRATE=false", "OUTBOXMILL_NAMESPACE=" + ns, "HTTP_ADDR=127.0.0.1:0",
			"DATABASE_URL=", "AMQP_URL=", // from the files only
			"DATABASE_URL_FILE=" + filepath.Join(secrets, module+".database-url"),
			"AMQP_URL_FILE=" + filepath.Join(secrets, module+".amqp-url"),
		}, filepath.Join(t.TempDir(), module+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		return p
	}
	orders, settlement := start("orders"), start("settlement")
	c := stack.NewClient()
	o, _, err := c.PlaceOrder(ctx, orders.URL(), "customer-lp", 1000, "EUR", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pay(ctx, orders.URL(), o.ID, o.Amount); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settleTimeout, "the order settled through the least-privilege services", func() (bool, error) {
		got, err := c.Settlement(ctx, settlement.URL(), o.ID)
		return err == nil && got.Status == "settled", err
	})

	runScript()
	newAMQP, err := os.ReadFile(filepath.Join(secrets, "orders.amqp-url"))
	if err != nil {
		t.Fatal(err)
	}
	if string(newAMQP) == string(oldAMQP) {
		t.Fatal("running the script again kept the broker password")
	}
	if conn, err := rabbitmq.Dial(ctx, string(oldAMQP)); err == nil {
		_ = conn.Close()
		t.Error("the broker accepts the old password after rotation")
	}
	conn, err := rabbitmq.Dial(ctx, string(newAMQP))
	if err != nil {
		t.Fatalf("the new password: %v", err)
	}
	_ = conn.Close()
}
