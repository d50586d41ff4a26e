package instance

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxmill/outboxmill/internal/testenv"
)

// Postgres is a private PostgreSQL cluster: initialised with initdb in a
// directory of its own, run by the postgres OS user (initdb and the server
// refuse root; a test run by another user runs it as itself), listening on
// 127.0.0.1 only, with trust authentication for the superuser postgres,
// 16 MB of shared buffers and 50 connections at most, and set up for
// logical replication (wal_level=logical, 10 replication slots and 10
// walsenders), so that a CDC relay can run against it. Its server
// settings are otherwise the defaults, fsync and synchronous_commit
// included, so a commit it acknowledged survives a kill -9.
type Postgres struct {
	// Port is the TCP port it listens on, on 127.0.0.1.
	Port int
	// Dir is the data directory.
	Dir string

	root     string
	binDir   string
	logPath  string
	settings []string
	cred     *syscall.Credential

	mu   sync.Mutex
	proc *process
}

// PostgresOption changes how StartPostgres sets up the cluster.
type PostgresOption func(*postgresOptions)

type postgresOptions struct {
	settings []string
	tls      *TLSFiles
}

// WithSetting sets a server parameter (postgres -c name=value), after and
// over the package's own: WithSetting("max_connections", "80").
func WithSetting(name, value string) PostgresOption {
	return func(o *postgresOptions) { o.settings = append(o.settings, name+"="+value) }
}

// WithPostgresTLS turns TLS on with the server certificate and key of
// files (ssl=on): the server accepts TLS and plain connections alike, and
// a client that asks for sslmode=verify-full with sslrootcert=files.CA
// (see TLSURL) verifies it. The key is copied for the server's user, mode
// 0600, as PostgreSQL requires.
func WithPostgresTLS(files TLSFiles) PostgresOption {
	return func(o *postgresOptions) { o.tls = &files }
}

// replicationCapacity is a private cluster's max_replication_slots and
// max_wal_senders: enough for the few CDC relays one test runs.
const replicationCapacity = 10

// Timeouts that guard against a hang; a server normally takes well under a
// second to start and to recover.
const (
	readyTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
)

// StartPostgres initialises and starts a private PostgreSQL cluster and
// waits until it accepts connections. When t ends the server is stopped
// (immediate shutdown, then kill -9 of whatever is left) and its directory
// removed; its log is printed first if t failed.
func StartPostgres(t testing.TB, opts ...PostgresOption) *Postgres {
	if testing.Short() {
		t.Skip("short mode: starts a private server (the full suite runs it)")
	}
	t.Helper()
	var o postgresOptions
	for _, opt := range opts {
		opt(&o)
	}
	begin := time.Now()
	binDir, err := postgresBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := postgresCredential()
	if err != nil {
		t.Fatal(err)
	}
	root, err := newRoot("pg")
	if err != nil {
		t.Fatal(err)
	}
	p := &Postgres{
		Dir: filepath.Join(root, "data"), root: root, binDir: binDir,
		logPath: filepath.Join(root, "postgres.log"), cred: cred,
	}
	t.Cleanup(func() { p.cleanup(t) })
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("private postgres: %v", err)
		}
	}
	p.settings = []string{
		"listen_addresses=127.0.0.1",
		"unix_socket_directories=",
		"shared_buffers=16MB",
		"max_connections=50",
		"logging_collector=off",
		"wal_level=logical",
		"max_replication_slots=" + strconv.Itoa(replicationCapacity),
		"max_wal_senders=" + strconv.Itoa(replicationCapacity),
	}
	if o.tls != nil {
		uid, gid := -1, -1
		if cred != nil {
			uid, gid = int(cred.Uid), int(cred.Gid)
		}
		cert, key := filepath.Join(root, "server.crt"), filepath.Join(root, "server.key")
		if err := copyFile(o.tls.Cert, cert, 0o644, uid, gid); err != nil {
			t.Fatalf("private postgres: %v", err)
		}
		if err := copyFile(o.tls.Key, key, 0o600, uid, gid); err != nil {
			t.Fatalf("private postgres: %v", err)
		}
		p.settings = append(p.settings, "ssl=on", "ssl_cert_file="+cert, "ssl_key_file="+key)
	}
	p.settings = append(p.settings, o.settings...)

	initdb := exec.Command(filepath.Join(binDir, "initdb"), "--pgdata", p.Dir, "--username", "postgres",
		"--auth", "trust", "--encoding", "UTF8", "--locale", "C", "--no-sync", "--no-instructions")
	initdb.Dir = root
	initdb.Env = cleanEnviron()
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("private postgres: initdb: %v\n%s", err, out)
	}

	// A port picked free can be taken before the server binds it: start
	// again on another one.
	for attempt := 1; ; attempt++ {
		if p.Port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		err := p.start()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("private postgres: %v; log:\n%s", err, tail(p.logPath, 30))
		}
	}
	t.Logf("private postgres on 127.0.0.1:%d ready in %s (%s)", p.Port, time.Since(begin).Round(time.Millisecond), root)
	return p
}

// postgresBinDir returns the newest /usr/lib/postgresql/<version>/bin.
func postgresBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			found = append(found, d)
		}
	}
	if len(found) == 0 {
		return "", fmt.Errorf("private postgres: no /usr/lib/postgresql/*/bin/initdb")
	}
	version := func(d string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return v
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return found[0], nil
}

// postgresCredential returns the postgres OS user to run the server as when
// this process is root, and nil otherwise.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("private postgres: running as root, and no postgres user to run the server as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("private postgres: postgres user has uid %q, gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// start starts the server on p.Port and waits until it accepts connections.
func (p *Postgres) start() error {
	args := []string{"-D", p.Dir, "-p", strconv.Itoa(p.Port)}
	for _, s := range p.settings {
		args = append(args, "-c", s)
	}
	proc, err := startProcess(filepath.Join(p.binDir, "postgres"), args, nil, p.root, p.logPath, p.cred)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.proc = proc
	p.mu.Unlock()
	err = pollUntil(proc, readyTimeout, 20*time.Millisecond, p.ping)
	if err != nil && !proc.exited() {
		_ = killMarked(p.root, false, stopTimeout)
	}
	return err
}

// ping connects as the superuser and runs a query.
func (p *Postgres) ping() error {
	cfg, err := pgx.ParseConfig(p.AdminURL())
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err = conn.Exec(ctx, "SELECT 1"); err != nil {
		return err
	}
	return listensHere(p.root, p.Port)
}

// AdminURL is the URL of the postgres database as the superuser postgres.
func (p *Postgres) AdminURL() string { return p.URL("postgres") }

// URL is the URL of database as the superuser postgres.
func (p *Postgres) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.Port, url.PathEscape(database))
}

// TLSURL is the URL of database as the superuser postgres over TLS,
// verifying the server's certificate and name with the CA certificate in
// the file rootCert (sslmode=verify-full): for a server started
// WithPostgresTLS.
func (p *Postgres) TLSURL(database, rootCert string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=verify-full&sslrootcert=%s",
		p.Port, url.PathEscape(database), url.QueryEscape(rootCert))
}

// Env is a testenv.Env with this server as its admin database; AMQPURL is
// empty, for the caller to fill.
func (p *Postgres) Env() testenv.Env { return testenv.Env{AdminDatabaseURL: p.AdminURL()} }

// Running reports whether the server process runs.
func (p *Postgres) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil && !p.proc.exited()
}

// PID is the postmaster's process id (0 if it never started).
func (p *Postgres) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return 0
	}
	return p.proc.cmd.Process.Pid
}

// Kill kills the postmaster and every process it started (backends,
// background workers) with kill -9, all at once, and waits until they are
// gone: a crash that leaves the data directory as it was at that instant.
// Start recovers from it.
func (p *Postgres) Kill(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	proc := p.proc
	p.mu.Unlock()
	if err := killMarked(p.root, false, stopTimeout); err != nil {
		t.Fatalf("private postgres: kill: %v", err)
	}
	if proc != nil && !proc.wait(stopTimeout) {
		t.Fatalf("private postgres: the postmaster did not exit after kill -9")
	}
}

// Stop shuts the server down in fast mode (pg_ctl stop -m fast: SIGINT to
// the postmaster: sessions are disconnected, a checkpoint is written) and
// waits until every process of it has exited.
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	proc := p.proc
	p.mu.Unlock()
	if proc == nil {
		return
	}
	proc.signal(syscall.SIGINT)
	if !proc.wait(stopTimeout) {
		t.Fatalf("private postgres: no exit within %s of a fast shutdown; log:\n%s", stopTimeout, tail(p.logPath, 20))
	}
	if err := killMarked(p.root, false, stopTimeout); err != nil {
		t.Fatalf("private postgres: after stop: %v", err)
	}
}

// Start starts the server again, on the same port and data directory,
// after Kill or Stop, and waits until it accepts connections: after Kill,
// once it has recovered from the crash.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	if p.Running() {
		t.Fatalf("private postgres: start: already running")
	}
	begin := time.Now()
	// Another process may hold the port for a moment (a client's outgoing
	// connection bound to it): try again until the hang guard.
	var err error
	for time.Since(begin) < readyTimeout {
		if err = p.start(); err == nil {
			t.Logf("private postgres on 127.0.0.1:%d started again in %s", p.Port, time.Since(begin).Round(time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("private postgres: start again: %v; log:\n%s", err, tail(p.logPath, 30))
}

// cleanup stops the server (immediate shutdown, then kill -9 of whatever is
// left) and removes its directory.
func (p *Postgres) cleanup(t testing.TB) {
	p.mu.Lock()
	proc := p.proc
	p.mu.Unlock()
	if proc != nil {
		proc.signal(syscall.SIGQUIT)
		proc.wait(10 * time.Second)
	}
	if err := killMarked(p.root, true, stopTimeout); err != nil {
		t.Errorf("private postgres: clean up: %v", err)
	}
	if t.Failed() {
		t.Logf("private postgres log (%s), last lines:\n%s", p.logPath, tail(p.logPath, 40))
	}
	if err := os.RemoveAll(p.root); err != nil {
		t.Errorf("private postgres: remove %s: %v", p.root, err)
	}
}

// String names the server for logs.
func (p *Postgres) String() string {
	return "postgres 127.0.0.1:" + strconv.Itoa(p.Port) + " (" + strings.TrimPrefix(p.root, os.TempDir()+"/") + ")"
}

// StartStandby makes a streaming standby of p and starts it: a base backup
// of p taken over loopback by the postgres OS user (pg_basebackup -R, which
// writes standby.signal and primary_conninfo, the WAL streamed alongside),
// in a directory of its own, run with p's settings and opts on a port of
// its own, with cluster_name set to name, which its WAL receiver gives p as
// its application_name (what synchronous_standby_names names). It waits
// until p shows the standby streaming. The standby accepts read-only
// sessions until Promote. When t ends it is stopped and removed as p is.
// p must be running.
func (p *Postgres) StartStandby(t testing.TB, name string, opts ...PostgresOption) *Postgres {
	t.Helper()
	var o postgresOptions
	for _, opt := range opts {
		opt(&o)
	}
	begin := time.Now()
	root, err := newRoot("pg")
	if err != nil {
		t.Fatal(err)
	}
	s := &Postgres{
		Dir: filepath.Join(root, "data"), root: root, binDir: p.binDir,
		logPath: filepath.Join(root, "postgres.log"), cred: p.cred,
	}
	t.Cleanup(func() { s.cleanup(t) })
	if s.cred != nil {
		if err := os.Chown(root, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatalf("private postgres standby: %v", err)
		}
	}
	backup := exec.Command(filepath.Join(p.binDir, "pg_basebackup"), "-R", "-h", "127.0.0.1", "-p", strconv.Itoa(p.Port),
		"-U", "postgres", "-D", s.Dir, "-X", "stream", "--checkpoint=fast", "--no-sync")
	backup.Dir = root
	backup.Env = cleanEnviron()
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("private postgres standby: pg_basebackup from port %d: %v\n%s", p.Port, err, out)
	}
	s.settings = append(append(append([]string{}, p.settings...), "cluster_name="+name), o.settings...)
	for attempt := 1; ; attempt++ {
		if s.Port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		err := s.start()
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatalf("private postgres standby: %v; log:\n%s", err, tail(s.logPath, 30))
		}
	}
	if err := p.awaitStandby(name, readyTimeout); err != nil {
		t.Fatalf("private postgres standby: %v; its log:\n%s", err, tail(s.logPath, 30))
	}
	t.Logf("private postgres standby %q of port %d on 127.0.0.1:%d streaming in %s (%s)",
		name, p.Port, s.Port, time.Since(begin).Round(time.Millisecond), root)
	return s
}

// awaitStandby waits until p's pg_stat_replication shows a standby with
// application_name name streaming.
func (p *Postgres) awaitStandby(name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var state string
		err := p.query(`SELECT state FROM pg_stat_replication WHERE application_name = $1`, []any{name}, &state)
		if err == nil && state == "streaming" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("standby %q not streaming from port %d within %s (state %q, %v)", name, p.Port, timeout, state, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// query runs sql with args on p's postgres database as the superuser and
// scans its one row into dest.
func (p *Postgres) query(sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// Promote promotes a standby made by StartStandby to a primary (pg_ctl
// promote) and waits until it has left recovery and accepts writes.
func (p *Postgres) Promote(t testing.TB) {
	t.Helper()
	begin := time.Now()
	promote := exec.Command(filepath.Join(p.binDir, "pg_ctl"), "promote", "-D", p.Dir, "-w", "-t",
		strconv.Itoa(int(readyTimeout/time.Second)))
	promote.Dir = p.root
	promote.Env = cleanEnviron()
	promote.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := promote.CombinedOutput(); err != nil {
		t.Fatalf("private postgres: pg_ctl promote: %v\n%s\nlog:\n%s", err, out, tail(p.logPath, 30))
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		var recovering bool
		err := p.query(`SELECT pg_is_in_recovery()`, nil, &recovering)
		if err == nil && !recovering {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("private postgres: still in recovery %s after pg_ctl promote (%v); log:\n%s", readyTimeout, err, tail(p.logPath, 30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("private postgres on 127.0.0.1:%d promoted in %s", p.Port, time.Since(begin).Round(time.Millisecond))
}

// MultiHostURL is the URL of database as the superuser postgres listing the
// servers in turn, with target_session_attrs=read-write: a client (pgx, libpq)
// connects to the first of them that accepts writes, so that after a
// failover new sessions go to the promoted standby.
func MultiHostURL(database string, servers ...*Postgres) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(s.Port)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write",
		strings.Join(hosts, ","), url.PathEscape(database))
}

// RequireSynchronousStandby makes p's commits wait until the standby whose
// application_name is name has flushed them (synchronous_standby_names, set
// with ALTER SYSTEM and a reload, with synchronous_commit at its default,
// on), and waits until p reports that standby synchronous. From then on a
// commit p acknowledged is on the standby's disk as well: a Promote after a
// Kill of p keeps it. A commit waits for as long as the standby is away.
func (p *Postgres) RequireSynchronousStandby(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		t.Fatalf("private postgres: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = `+
		quoteLiteral(pgx.Identifier{name}.Sanitize())); err != nil {
		t.Fatalf("private postgres: set synchronous_standby_names: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatalf("private postgres: reload: %v", err)
	}
	for {
		var state string
		err := conn.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, name).Scan(&state)
		if err == nil && state == "sync" {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("private postgres: standby %q not synchronous within %s (sync_state %q, %v)", name, readyTimeout, state, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
