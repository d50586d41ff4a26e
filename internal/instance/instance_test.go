package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// gone checks that nothing of the instance in dir is left: no process, no
// directory.
func gone(t *testing.T, dir string) {
	t.Helper()
	if pids := markedProcesses(dir, true); len(pids) > 0 {
		t.Errorf("processes %v of %s left behind", pids, dir)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left behind (%v)", dir, err)
	}
}

// refuses checks that no process of the instance in dir listens on port
// any more. A connection that is accepted all the same is looked into: a
// socket connected to itself (Linux may pick the port dialled, free, as the
// dialling socket's own) or a listener of another process, which took the
// port once it was free, is not the instance's. When no listener is found
// at all, one came and went between the dial and the look: the check runs
// again, a bounded number of times.
func refuses(t *testing.T, dir string, port int) {
	t.Helper()
	for range 20 {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return
		}
		self := conn.LocalAddr().String() == conn.RemoteAddr().String()
		conn.Close()
		if self {
			t.Logf("port %d: the dial connected to itself; nothing listens there", port)
			return
		}
		pids := listeningProcesses(port)
		ours := markedProcesses(dir, false)
		for _, pid := range pids {
			if slices.Contains(ours, pid) {
				t.Errorf("port %d still accepts connections, from process %d of the instance", port, pid)
				return
			}
		}
		if len(pids) > 0 {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pids[0]))
			t.Logf("port %d was taken, once free, by process %d (%s), not the instance's", port, pids[0], strings.TrimSpace(string(comm)))
			return
		}
		t.Logf("port %d accepted a connection, but no process listens there now; looking again", port)
	}
	t.Errorf("port %d kept accepting connections, and no listening process was found", port)
}

func pgExec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func pgRows(t *testing.T, url string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT note FROM kept ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	notes, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return notes
}

func TestPostgres_KillAndStart(t *testing.T) {
	skipShort(t)
	t.Parallel()
	var dir string
	t.Run("instance", func(t *testing.T) {
		pg := StartPostgres(t, WithSetting("max_connections", "20"))
		dir = pg.root
		if pg.Env().AdminDatabaseURL != pg.AdminURL() || pg.Env().AMQPURL != "" {
			t.Errorf("Env() = %+v", pg.Env())
		}
		if err := pg.Env().CreateDatabase(context.Background(), "kept_db"); err != nil {
			t.Fatal(err)
		}
		url := pg.URL("kept_db")
		pgExec(t, url, `CREATE TABLE kept (id serial PRIMARY KEY, note text NOT NULL)`)
		pgExec(t, url, `INSERT INTO kept (note) VALUES ('committed before the kill')`)
		// A transaction still open at the kill must be rolled back.
		ctx := context.Background()
		open, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := open.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO kept (note) VALUES ('open at the kill')`); err != nil {
			t.Fatal(err)
		}
		backends := len(markedProcesses(pg.root, false))
		if backends < 3 {
			t.Fatalf("%d processes of the server found; want the postmaster and its children", backends)
		}

		pg.Kill(t)
		if pids := markedProcesses(pg.root, false); len(pids) > 0 {
			t.Fatalf("processes %v survived the kill", pids)
		}
		refuses(t, pg.root, pg.Port)
		if err := open.Ping(ctx); err == nil {
			t.Error("a session survived the kill")
		}
		pg.Start(t)
		if got := pgRows(t, url); len(got) != 1 || got[0] != "committed before the kill" {
			t.Errorf("after kill -9 and restart the table holds %q, want the committed row only", got)
		}

		pgExec(t, url, `INSERT INTO kept (note) VALUES ('committed before the stop')`)
		pg.Stop(t)
		refuses(t, pg.root, pg.Port)
		pg.Start(t)
		if got := pgRows(t, url); len(got) != 2 {
			t.Errorf("after stop and start the table holds %q", got)
		}
	})
	gone(t, dir)
}

func TestStartPostgres_LogicalReplication(t *testing.T) {
	skipShort(t)
	t.Parallel()
	pg := StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	capacity := strconv.Itoa(replicationCapacity)
	for name, want := range map[string]string{"wal_level": "logical", "max_replication_slots": capacity, "max_wal_senders": capacity} {
		var got string
		if err := admin.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}

	// A pgoutput slot decodes a committed insert into a published table.
	if err := pg.Env().CreateDatabase(ctx, "cdc_db"); err != nil {
		t.Fatal(err)
	}
	url := pg.URL("cdc_db")
	pgExec(t, url, `CREATE TABLE kept (id serial PRIMARY KEY, note text NOT NULL)`)
	pgExec(t, url, `CREATE PUBLICATION kept_pub FOR TABLE kept`)
	pgExec(t, url, `SELECT pg_create_logical_replication_slot('kept_slot', 'pgoutput')`)
	pgExec(t, url, `INSERT INTO kept (note) VALUES ('decoded')`)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// pgoutput messages start with their type; 'I' is an Insert.
	var inserts int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_get_binary_changes('kept_slot', NULL, NULL,
		'proto_version', '1', 'publication_names', 'kept_pub') WHERE get_byte(data, 0) = ascii('I')`).Scan(&inserts)
	if err != nil {
		t.Fatal(err)
	}
	if inserts != 1 {
		t.Errorf("the slot decoded %d inserts; want the one committed", inserts)
	}
}

func TestRabbit_KillAndStart(t *testing.T) {
	skipShort(t)
	t.Parallel()
	var dir string
	t.Run("instance", func(t *testing.T) {
		r := StartRabbit(t)
		dir = r.Dir
		// The node takes connections before its boot has finished; the
		// queue is declared once it has.
		r.Ctl(t, "await_startup")
		publish(t, r.URL(), "kept", nil, "persistent before the kill")
		// The broker confirms a persistent message once it is on disk, but
		// the declaration of a queue made moments before a kill -9 was lost
		// twice under load (the restarted node had no queue "kept"): it
		// lives in Mnesia, whose log is dumped to its tables here. What is
		// tested is that the harness's kill and restart keep the node's
		// data, not how soon RabbitMQ makes a declaration durable.
		r.Ctl(t, "eval", "mnesia:dump_log().")
		r.Kill(t)
		if pids := markedProcesses(r.Dir, false); len(pids) > 0 {
			t.Fatalf("processes %v survived the kill", pids)
		}
		refuses(t, r.Dir, r.Port)
		r.Start(t)
		if got := get(t, r.URL(), "kept"); got != "persistent before the kill" {
			t.Errorf("after kill -9 and restart the queue holds %q", got)
		}
	})
	gone(t, dir)
}

func TestRabbitCluster_NodeLoss(t *testing.T) {
	skipShort(t)
	t.Parallel()
	var dirs []string
	t.Run("cluster", func(t *testing.T) {
		nodes := StartRabbitCluster(t, 3)
		for _, r := range nodes {
			dirs = append(dirs, r.Dir)
		}
		// Declared through the first node, the quorum queue's leader is
		// there; its members are all three nodes, each started before the
		// test goes on.
		declare(t, nodes[0].URL(), "kept-quorum", amqp.Table{"x-queue-type": "quorum"})
		membersOnline(t, nodes[0], "kept-quorum", 3)
		publish(t, nodes[0].URL(), "kept-quorum", amqp.Table{"x-queue-type": "quorum"}, "before the loss")
		nodes[0].Kill(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		running, err := nodes[1].RunningNodes(ctx)
		if err != nil || len(running) != 2 {
			t.Errorf("after the kill, running nodes %v (%v), want 2", running, err)
		}
		// Two of three nodes keep the quorum queue working.
		publish(t, nodes[2].URL(), "kept-quorum", amqp.Table{"x-queue-type": "quorum"}, "during the loss")
		if got := get(t, nodes[1].URL(), "kept-quorum"); got != "before the loss" {
			t.Errorf("got %q from the quorum queue, want the message published before the loss", got)
		}
		nodes[0].Start(t)
		if running, err := nodes[0].RunningNodes(ctx); err != nil || len(running) != 3 {
			t.Errorf("after the restart, running nodes %v (%v), want 3", running, err)
		}
		if got := get(t, nodes[0].URL(), "kept-quorum"); got != "during the loss" {
			t.Errorf("got %q from the restarted node, want the message published during the loss", got)
		}
	})
	for _, d := range dirs {
		gone(t, d)
	}
}

// declare declares the durable queue (with args).
func declare(t *testing.T, url, queue string, args amqp.Table) {
	t.Helper()
	conn, _ := declared(t, url, queue, args)
	conn.Close()
}

// declared connects to url, opens a channel and declares the durable queue
// (with args) on it; the caller closes the connection.
func declared(t *testing.T, url, queue string, args amqp.Table) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn, ch
}

// membersOnline waits until the quorum queue has a leader and n members
// online, as r sees it.
func membersOnline(t *testing.T, r *Rabbit, queue string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last string
	for {
		out, err := r.ctl(ctx, "list_queues", "name", "leader", "online", "--formatter", "json")
		last = fmt.Sprintf("%s (%v)", out, err)
		var queues []struct {
			Name   string   `json:"name"`
			Leader string   `json:"leader"`
			Online []string `json:"online"`
		}
		if err == nil && json.Unmarshal([]byte(out), &queues) == nil {
			for _, q := range queues {
				if q.Name == queue && q.Leader != "" && len(q.Online) == n {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("quorum queue %s: no leader with %d members online: %s", queue, n, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// publish declares the durable queue (with args) and publishes body to it,
// persistent, waiting for the broker's confirm. A nack (a quorum queue whose
// members have not all started may refuse a message) is answered by
// publishing again, as a producer must, on a new channel: RabbitMQ 3.10
// gives a channel opened while a quorum queue's leader is being replaced
// the leader its queue record still names, and that channel's publishes are
// nacked for as long as it lives.
func publish(t *testing.T, url, queue string, args amqp.Table, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if publishOnce(t, ctx, url, queue, args, body) {
			return
		}
		t.Logf("publish to %s: nacked, publishing again on a new channel", queue)
		select {
		case <-ctx.Done():
			t.Fatalf("publish to %s: nacked until %v", queue, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// publishOnce publishes body on a channel of its own and reports whether
// the broker confirmed it.
func publishOnce(t *testing.T, ctx context.Context, url, queue string, args amqp.Table, body string) bool {
	t.Helper()
	conn, ch := declared(t, url, queue, args)
	defer conn.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		t.Fatalf("publish to %s: %v", queue, err)
	}
	return ok
}

// get takes one message from queue.
func get(t *testing.T, url, queue string) string {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	m, ok, err := ch.Get(queue, true)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return ""
	}
	return string(m.Body)
}

func TestReapLeftovers(t *testing.T) {
	skipShort(t)
	t.Parallel()
	// An instance of a live owner (this test process). Creating it runs
	// this process's own reaping first, so that only the explicit call
	// below finds the leftover.
	mine, err := newRoot("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killMarked(mine, true, time.Minute); _ = os.RemoveAll(mine) })
	kept, err := startProcess("sleep", []string{"600"}, nil, mine, filepath.Join(mine, "out"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The owner of the leftover: a process that has exited, as a test binary killed before
	// its clean-up.
	owner := exec.Command("true")
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	ownerPID, ownerStart := owner.Process.Pid, processStart(owner.Process.Pid)
	if err := owner.Wait(); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("", rootPrefix+"test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killMarked(root, true, time.Minute); _ = os.RemoveAll(root) })
	if err := os.WriteFile(filepath.Join(root, ownerFile), fmt.Appendf(nil, "%d %s\n", ownerPID, ownerStart), 0o644); err != nil {
		t.Fatal(err)
	}
	// Its server, still running.
	left, err := startProcess("sleep", []string{"600"}, nil, root, filepath.Join(root, "out"), nil)
	if err != nil {
		t.Fatal(err)
	}

	reapLeftovers()
	if !left.wait(time.Minute) {
		t.Error("the leftover server still runs")
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the leftover directory is still there (%v)", err)
	}
	if kept.exited() {
		t.Error("the server of a live owner was killed")
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("the directory of a live owner was removed: %v", err)
	}
}

// A primary with a synchronous standby made by StartStandby is killed
// (kill -9) while a transaction is open; the promoted standby has every
// transaction the primary acknowledged, not the open one, and takes
// writes; a multi-host URL with target_session_attrs=read-write reaches it
// with the old primary's address first.
func TestPostgres_StandbyPromotedAfterKill(t *testing.T) {
	skipShort(t)
	t.Parallel()
	primary := StartPostgres(t, WithSetting("max_connections", "20"))
	standby := primary.StartStandby(t, "standby_one", WithSetting("max_connections", "20"))
	if standby.Port == primary.Port || standby.root == primary.root {
		t.Fatalf("the standby shares the primary's port or directory: %s, %s", standby, primary)
	}
	primary.RequireSynchronousStandby(t, "standby_one")
	if err := primary.Env().CreateDatabase(context.Background(), "kept_db"); err != nil {
		t.Fatal(err)
	}
	url := primary.URL("kept_db")
	pgExec(t, url, `CREATE TABLE kept (id serial PRIMARY KEY, note text NOT NULL)`)
	for i := range 20 {
		pgExec(t, url, `INSERT INTO kept (note) VALUES ($1)`, fmt.Sprintf("acknowledged %d", i))
	}
	ctx := context.Background()
	open, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO kept (note) VALUES ('open at the kill')`); err != nil {
		t.Fatal(err)
	}
	// The standby is read-only until promoted.
	var readOnly string
	if err := standby.query(`SHOW transaction_read_only`, nil, &readOnly); err != nil || readOnly != "on" {
		t.Fatalf("the standby's transaction_read_only = %q (%v), want on", readOnly, err)
	}

	primary.Kill(t)
	standby.Promote(t)
	multi := MultiHostURL("kept_db", primary, standby)
	notes := pgRows(t, multi)
	if len(notes) != 20 || notes[0] != "acknowledged 0" || notes[19] != "acknowledged 19" {
		t.Fatalf("the promoted standby has %q, want the 20 acknowledged rows", notes)
	}
	pgExec(t, multi, `INSERT INTO kept (note) VALUES ('after the promotion')`)
	if notes := pgRows(t, standby.URL("kept_db")); notes[len(notes)-1] != "after the promotion" {
		t.Fatalf("the write through the multi-host URL did not reach the promoted standby: %q", notes)
	}
}

// skipShort skips t in short mode: every test here starts private servers.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("short mode: starts private servers (the full suite runs it)")
	}
}
