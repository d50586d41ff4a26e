package instance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitBinDir holds the RabbitMQ scripts that run as the calling user
// (/usr/sbin's wrappers switch to the rabbitmq user and its files).
const rabbitBinDir = "/usr/lib/rabbitmq/bin"

// Rabbit is a private RabbitMQ node: its own node name, AMQP and Erlang
// distribution ports (and AMQPS, WithRabbitTLS) on 127.0.0.1 only, database, logs, configuration and
// Erlang cookie in a directory of its own, no plugins (the management plugin
// is off). The guest user, which RabbitMQ admits from loopback only, may
// connect. It shares epmd, the machine's Erlang port mapper, with every
// other node.
type Rabbit struct {
	// Name is the node's Erlang name, <name>@localhost, as rabbitmqctl -n
	// takes it.
	Name string
	// Port is the AMQP port, on 127.0.0.1.
	Port int
	// DistPort is the Erlang distribution port (clustering, rabbitmqctl),
	// on 127.0.0.1.
	DistPort int
	// Dir is the node's directory: database (mnesia/), logs (log/),
	// configuration and the HOME holding its Erlang cookie (home/).
	Dir string
	// TLSPort is the AMQPS port, on 127.0.0.1, of a node started
	// WithRabbitTLS; 0 otherwise.
	TLSPort int

	logPath string
	tls     *TLSFiles
	// peers are the nodes a blank node joins at its first boot (peer
	// discovery from the configuration).
	peers []string

	mu   sync.Mutex
	proc *process
}

// RabbitOption changes how StartRabbit sets up the node.
type RabbitOption func(*Rabbit)

// WithRabbitTLS adds a TLS listener on TLSPort with the server certificate
// and key of files, beside the plain one: a client verifies the node with
// files.CA (see TLSURL). The node asks no client certificate.
func WithRabbitTLS(files TLSFiles) RabbitOption {
	return func(r *Rabbit) { r.tls = &files }
}

// StartRabbit starts a private RabbitMQ node and waits until AMQP
// connections work. When t ends the node is killed and its directory
// removed; its log is printed first if t failed.
func StartRabbit(t testing.TB, opts ...RabbitOption) *Rabbit {
	if testing.Short() {
		t.Skip("short mode: starts a private server (the full suite runs it)")
	}
	t.Helper()
	cookie, err := newCookie()
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRabbit(t, cookie)
	if err == nil {
		for _, opt := range opts {
			opt(r)
		}
		err = r.boot(t)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// StartRabbitCluster starts n private RabbitMQ nodes sharing one Erlang
// cookie: the first, then the others at once (a node takes seconds to
// boot), configured to join the first as they boot (peer discovery from the
// configuration; a joining node waits for a lock, so they join one after
// the other). The others wait for the first because nodes booting together
// may each migrate the schema for their feature flags and then refuse each
// other's (schema_integrity_check_failed). A node that booted alone all the same (the first was not up
// in time) is joined with rabbitmqctl (stop_app, join_cluster, start_app).
// It returns when the n nodes run as one cluster of disc nodes and each
// accepts AMQP connections.
func StartRabbitCluster(t testing.TB, n int) []*Rabbit {
	if testing.Short() {
		t.Skip("short mode: starts a private server (the full suite runs it)")
	}
	t.Helper()
	if n < 1 {
		t.Fatalf("private rabbitmq cluster: %d nodes", n)
	}
	begin := time.Now()
	cookie, err := newCookie()
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*Rabbit, n)
	for i := range nodes {
		if nodes[i], err = newRabbit(t, cookie); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			nodes[i].peers = []string{nodes[0].Name}
		}
	}
	if err := nodes[0].boot(t); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, r := range nodes[1:] {
		i := i + 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.boot(t)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	booted := time.Since(begin)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	running, err := nodes[0].RunningNodes(ctx)
	if err != nil {
		t.Fatalf("private rabbitmq cluster: %v", err)
	}
	// One node at a time: mnesia fails to start on nodes joining at once.
	var joined []string
	for _, r := range nodes[1:] {
		if slices.Contains(running, r.Name) {
			continue
		}
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", nodes[0].Name}, {"start_app"}} {
			if _, err := r.ctl(ctx, args...); err != nil {
				t.Fatalf("private rabbitmq cluster: %v", err)
			}
		}
		if err := r.waitAMQP(); err != nil {
			t.Fatalf("private rabbitmq cluster: node %s: %v", r.Name, err)
		}
		joined = append(joined, r.Name)
	}
	if len(joined) > 0 {
		if running, err = nodes[0].RunningNodes(ctx); err != nil {
			t.Fatalf("private rabbitmq cluster: %v", err)
		}
	}
	if len(running) != n {
		t.Fatalf("private rabbitmq cluster: running nodes %v, want %d", running, n)
	}
	// A node takes connections before its boot has finished: a quorum
	// queue declared then may not start its member there, and a queue
	// without a majority of members refuses every publish.
	for _, r := range nodes {
		if _, err := r.ctl(ctx, "await_startup"); err != nil {
			t.Fatalf("private rabbitmq cluster: node %s: %v", r.Name, err)
		}
	}
	// Nodes that formed the cluster as they booted may not have agreed on
	// their feature flags yet: until they do, a node may refuse to declare a
	// quorum queue ("the corresponding feature flag is disabled").
	if _, err := nodes[0].ctl(ctx, "enable_feature_flag", "all"); err != nil {
		t.Fatalf("private rabbitmq cluster: %v", err)
	}
	for _, r := range nodes {
		if err := r.waitFeatureFlag(ctx, "quorum_queue"); err != nil {
			t.Fatalf("private rabbitmq cluster: %v", err)
		}
	}
	how := "joined as they booted"
	if len(joined) > 0 {
		how = fmt.Sprintf("%s joined with rabbitmqctl", strings.Join(joined, ", "))
	}
	t.Logf("private rabbitmq cluster of %d nodes ready in %s (booted in %s; %s)", n, time.Since(begin).Round(time.Millisecond), booted.Round(time.Millisecond), how)
	return nodes
}

func newCookie() (string, error) {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("private rabbitmq: erlang cookie: %w", err)
	}
	return strings.ToUpper(hex.EncodeToString(b[:])), nil
}

// newRabbit sets up a node with cookie: its directory (removed when t
// ends), name and files. It may run on any goroutine: it returns errors
// instead of failing t.
func newRabbit(t testing.TB, cookie string) (*Rabbit, error) {
	if _, err := os.Stat(filepath.Join(rabbitBinDir, "rabbitmq-server")); err != nil {
		return nil, fmt.Errorf("private rabbitmq: %w", err)
	}
	root, err := newRoot("rabbit")
	if err != nil {
		return nil, err
	}
	r := &Rabbit{Dir: root, logPath: filepath.Join(root, "rabbitmq.out")}
	t.Cleanup(func() { r.cleanup(t) })
	r.Name = "obm-" + strings.TrimPrefix(filepath.Base(root), rootPrefix+"rabbit-") + "@localhost"
	home := filepath.Join(root, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, fmt.Errorf("private rabbitmq: %w", err)
	}
	files := map[string]string{
		"home/.erlang.cookie": cookie,
		"enabled_plugins":     "[].\n",
		"advanced.config":     "[].\n",
		"rabbitmq-env.conf":   "",
	}
	for name, content := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, "cookie") {
			mode = 0o400
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), mode); err != nil {
			return nil, fmt.Errorf("private rabbitmq: %w", err)
		}
	}
	return r, nil
}

// boot starts the node for the first time, on new ports, and waits until
// AMQP works. It may run on any goroutine.
func (r *Rabbit) boot(t testing.TB) error {
	begin := time.Now()
	// A port picked free can be taken before the node binds it: start
	// again on others.
	for attempt := 1; ; attempt++ {
		var err error
		if r.Port, err = freePort(); err != nil {
			return err
		}
		if r.DistPort, err = freePort(); err != nil {
			return err
		}
		if r.tls != nil {
			if r.TLSPort, err = freePort(); err != nil {
				return err
			}
		}
		if err = r.writeConfig(); err == nil {
			err = r.start()
		}
		if err == nil {
			break
		}
		if attempt == 3 {
			return fmt.Errorf("private rabbitmq %s: %w; output:\n%s\nlog:\n%s", r.Name, err, tail(r.logPath, 10), tail(r.nodeLog(), 30))
		}
	}
	t.Logf("private rabbitmq %s on 127.0.0.1:%d ready in %s (%s)", r.Name, r.Port, time.Since(begin).Round(time.Millisecond), r.Dir)
	return nil
}

// writeConfig writes the node's rabbitmq.conf.
func (r *Rabbit) writeConfig() error {
	conf := strings.Join([]string{
		"listeners.tcp.1 = 127.0.0.1:" + strconv.Itoa(r.Port),
		"loopback_users.guest = true",
		// A busy test machine's disk must not raise the free disk alarm,
		// which would block every publisher.
		"disk_free_limit.absolute = 1MB",
		"log.console = false",
		"log.file.level = info",
	}, "\n") + "\n"
	if r.tls != nil {
		conf += strings.Join([]string{
			"listeners.ssl.1 = 127.0.0.1:" + strconv.Itoa(r.TLSPort),
			"ssl_options.cacertfile = " + r.tls.CA,
			"ssl_options.certfile = " + r.tls.Cert,
			"ssl_options.keyfile = " + r.tls.Key,
			"ssl_options.verify = verify_none",
			"ssl_options.fail_if_no_peer_cert = false",
		}, "\n") + "\n"
	}
	if len(r.peers) > 0 {
		conf += "cluster_formation.peer_discovery_backend = classic_config\n"
		for i, p := range r.peers {
			conf += fmt.Sprintf("cluster_formation.classic_config.nodes.%d = %s\n", i+1, p)
		}
	}
	if err := os.WriteFile(filepath.Join(r.Dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("private rabbitmq: %w", err)
	}
	return nil
}

// env is the environment of the node's server and of rabbitmqctl for it.
func (r *Rabbit) env() []string {
	return []string{
		"HOME=" + filepath.Join(r.Dir, "home"),
		"LC_ALL=C.UTF-8",
		"ERL_CRASH_DUMP_SECONDS=0",
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"RABBITMQ_NODENAME=" + r.Name,
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(r.DistPort),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(r.Dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(r.Dir, "log"),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(r.Dir, "rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE=" + filepath.Join(r.Dir, "advanced.config"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(r.Dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(r.Dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(r.Dir, "rabbitmq.pid"),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
	}
}

// nodeLog is the node's own log file.
func (r *Rabbit) nodeLog() string { return filepath.Join(r.Dir, "log", r.Name+".log") }

// start starts the node and waits until AMQP works.
func (r *Rabbit) start() error {
	proc, err := startProcess(filepath.Join(rabbitBinDir, "rabbitmq-server"), nil, r.env(), r.Dir, r.logPath, nil)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.proc = proc
	r.mu.Unlock()
	err = r.waitAMQP()
	if err != nil && !proc.exited() {
		_ = killMarked(r.Dir, false, stopTimeout)
	}
	return err
}

// waitAMQP waits until an AMQP connection to the node opens a channel.
func (r *Rabbit) waitAMQP() error {
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	return pollUntil(proc, readyTimeout, 50*time.Millisecond, r.ping)
}

func (r *Rabbit) ping() error {
	conn, err := amqp.DialConfig(r.URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Close(); err != nil {
		return err
	}
	return listensHere(r.Dir, r.Port)
}

// URL is the node's AMQP URL as guest, default virtual host.
func (r *Rabbit) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", r.Port) }

// TLSURL is the node's AMQPS URL as guest, default virtual host, verifying
// the node's certificate with the CA certificate in the file caCert: for a
// node started WithRabbitTLS.
func (r *Rabbit) TLSURL(caCert string) string {
	return fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/?cacertfile=%s", r.TLSPort, url.QueryEscape(caCert))
}

// Running reports whether the node's start script runs.
func (r *Rabbit) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc != nil && !r.proc.exited()
}

// Kill kills the node's processes (its start script, the Erlang VM and the
// VM's helpers) with kill -9, all at once, and waits until they are gone.
func (r *Rabbit) Kill(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if err := killMarked(r.Dir, false, stopTimeout); err != nil {
		t.Fatalf("private rabbitmq %s: kill: %v", r.Name, err)
	}
	if proc != nil && !proc.wait(stopTimeout) {
		t.Fatalf("private rabbitmq %s: the start script did not exit after kill -9", r.Name)
	}
}

// Start starts the node again after Kill, on the same ports and database
// (a cluster member rejoins its cluster), and waits until AMQP works.
func (r *Rabbit) Start(t testing.TB) {
	t.Helper()
	if r.Running() {
		t.Fatalf("private rabbitmq %s: start: already running", r.Name)
	}
	begin := time.Now()
	// Another process may hold a port for a moment: try again until the
	// hang guard.
	var err error
	for time.Since(begin) < readyTimeout {
		if err = r.start(); err == nil {
			t.Logf("private rabbitmq %s started again in %s", r.Name, time.Since(begin).Round(time.Millisecond))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("private rabbitmq %s: start again: %v; log:\n%s", r.Name, err, tail(r.nodeLog(), 30))
}

// Ctl runs rabbitmqctl against the node (rabbitmqctl -n Name args...) and
// returns its output, failing t on error.
func (r *Rabbit) Ctl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	out, err := r.ctl(ctx, args...)
	if err != nil {
		t.Fatalf("private rabbitmq: %v", err)
	}
	return out
}

func (r *Rabbit) ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(rabbitBinDir, "rabbitmqctl"), append([]string{"-q", "-n", r.Name}, args...)...)
	cmd.Dir = r.Dir
	cmd.Env = append(cleanEnviron(), r.env()...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("rabbitmqctl -n %s %s: %w\n%s", r.Name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// waitFeatureFlag waits until the node reports feature flag name enabled.
func (r *Rabbit) waitFeatureFlag(ctx context.Context, name string) error {
	for {
		out, err := r.ctl(ctx, "list_feature_flags", "name", "state")
		if err == nil && slices.Contains(strings.Split(out, "\n"), name+"\tenabled") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s: feature flag %s not enabled (%v): %w\n%s", r.Name, name, err, ctx.Err(), out)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RunningNodes returns the cluster's running nodes as this node sees them.
func (r *Rabbit) RunningNodes(ctx context.Context) ([]string, error) {
	out, err := r.ctl(ctx, "cluster_status", "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var status struct {
		RunningNodes []string `json:"running_nodes"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		return nil, fmt.Errorf("rabbitmqctl cluster_status: %w\n%s", err, out)
	}
	return status.RunningNodes, nil
}

// cleanup kills the node and removes its directory.
func (r *Rabbit) cleanup(t testing.TB) {
	if err := killMarked(r.Dir, true, stopTimeout); err != nil {
		t.Errorf("private rabbitmq %s: clean up: %v", r.Name, err)
	}
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if proc != nil {
		proc.wait(10 * time.Second)
	}
	if t.Failed() {
		t.Logf("private rabbitmq %s log (%s), last lines:\n%s", r.Name, r.nodeLog(), tail(r.nodeLog(), 40))
	}
	if err := os.RemoveAll(r.Dir); err != nil {
		t.Errorf("private rabbitmq %s: remove %s: %v", r.Name, r.Dir, err)
	}
}
