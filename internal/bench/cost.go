package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"
	"github.com/jackc/pgx/v5"
)

// The terms of an event's cost: where the CPU time of a pipeline goes. The
// PostgreSQL terms are the server processes' own CPU time (/proc), split by
// the session that asked for the work (its application_name, or the
// walsender of a cdc relay); the bench terms split the bench process's CPU
// time (/proc/self/stat) by the pprof label of the goroutine that spent it.
const (
	termPGProducers = "postgres: producers' sessions"
	termPGRelay     = "postgres: relay's sessions"
	termPGConsumer  = "postgres: consumer's sessions"
	termPGServer    = "postgres: server processes"
	termBroker      = "rabbitmq"
	termProducers   = "producers"
	termRelay       = "relay"
	termConsumer    = "consumer"
	termRuntime     = "bench runtime"
	// termBench is the whole bench process when its CPU time cannot be
	// split (another CPU profile runs).
	termBench = "bench process, not split"
)

// costTerms lists the terms in the order the report shows them.
var costTerms = []string{
	termPGProducers, termPGRelay, termPGConsumer, termPGServer, termBroker,
	termProducers, termRelay, termConsumer, termRuntime, termBench,
}

// Component labels: the pprof label componentLabel of the goroutines of each
// part of a pipeline in the bench process, and the application_name of its
// database sessions.
const (
	componentLabel     = "component"
	componentProducers = "producers"
	componentRelay     = "relay"
	componentConsumer  = "consumer"
	// componentMonitor is the bench's own watching (the horizon watch, the
	// cost window): left out of every cost.
	componentMonitor = "monitor"
)

// appNames maps each component to the application_name of its sessions
// (without spaces, which a URL's query would carry as '+').
var appNames = map[string]string{
	componentProducers: "bench-producers",
	componentRelay:     "bench-relay",
	componentConsumer:  "bench-consumer",
	componentMonitor:   "bench-monitor",
}

// withApplicationName returns the database URL rawURL with the
// application_name of component's sessions.
func withApplicationName(rawURL, component string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL // postgres.Open reports the malformed URL
	}
	q := u.Query()
	q.Set("application_name", appNames[component])
	u.RawQuery = q.Encode()
	return u.String()
}

// labelled runs fn with the pprof label of component: the goroutines fn
// starts inherit it, so the bench process's CPU time can be split between
// producers, relay and consumer.
func labelled(ctx context.Context, component string, fn func(context.Context)) {
	pprof.Do(ctx, pprof.Labels(componentLabel, component), fn)
}

// costSample is what one window cost: CPU seconds per term, WAL bytes and
// broker bytes, and the events handled meanwhile.
type costSample struct {
	Events int64 `json:"events"`
	// CPU holds CPU seconds by term.
	CPU map[string]float64 `json:"cpu_s"`
	// WAL is the WAL the server wrote (pg_current_wal_lsn), server-wide.
	WAL float64 `json:"wal_bytes"`
	// BrokerIn and BrokerOut are the bytes sent to and received from the
	// broker on this machine's connections to its AMQP port (ss tcp_info).
	BrokerIn  float64 `json:"broker_in_bytes"`
	BrokerOut float64 `json:"broker_out_bytes"`
	// BrokerDisk is what the broker process wrote to storage
	// (/proc/PID/io write_bytes).
	BrokerDisk float64 `json:"broker_disk_bytes"`
	// Excluded is the CPU time of other databases' sessions on the same
	// server and of the bench's own watching, left out.
	Excluded float64 `json:"excluded_cpu_s"`
}

// costMeter finds, once per run, the processes whose CPU time a cost
// window reads. What it cannot find is left out of every window, with a
// note.
type costMeter struct {
	postmaster int // 0 when PostgreSQL's processes are not readable here
	broker     int // 0 when the broker's process is not readable here
	amqpPort   string
	ss         bool // ss (iproute2) reads the bytes of the broker's connections
	notes      []string
}

// newCostMeter locates the PostgreSQL server's processes (the parent of its
// checkpointer) and the broker's (the process listening on the AMQP URL's
// port).
func (e *env) newCostMeter(ctx context.Context) *costMeter {
	m := &costMeter{amqpPort: "5672"}
	if u, err := url.Parse(e.servers.AMQPURL); err == nil && u.Port() != "" {
		m.amqpPort = u.Port()
	}
	conn, err := pgx.Connect(ctx, withApplicationName(e.servers.AdminDatabaseURL, componentMonitor))
	if err == nil {
		var pid int
		err = conn.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'`).Scan(&pid)
		conn.Close(context.WithoutCancel(ctx))
		if err == nil {
			if st, serr := readProcStat(pid); serr == nil && st.comm == "postgres" {
				m.postmaster = st.ppid
			} else {
				err = fmt.Errorf("its checkpointer (pid %d) is not a process of this machine", pid)
			}
		}
	}
	if m.postmaster == 0 {
		m.notes = append(m.notes, fmt.Sprintf("cost: PostgreSQL's CPU time is not measured: %v", err))
	}
	if pid, err := listeningProcess(m.amqpPort); err == nil {
		m.broker = pid
	} else {
		m.notes = append(m.notes, fmt.Sprintf("cost: RabbitMQ's CPU time and disk writes are not measured: %v", err))
	}
	if _, err := exec.LookPath("ss"); err != nil {
		m.notes = append(m.notes, "cost: broker bytes are not measured: ss (iproute2) is not installed")
	} else {
		m.ss = true
	}
	return m
}

// costWindow is a cost measurement in progress.
type costWindow struct {
	m        *costMeter
	conn     *pgx.Conn
	own      []string // the pipeline's databases
	self     float64
	pg       map[int]pgProcess
	broker   float64
	disk     float64
	wire     map[string][2]float64
	lsn      uint64
	profile  *bytes.Buffer
	profiled bool
}

// pgProcess is a PostgreSQL process and the term its CPU time counts in.
type pgProcess struct {
	cpu  float64
	term string // "" when left out
}

// start opens a window over the pipeline whose databases are own.
func (m *costMeter) start(ctx context.Context, adminURL string, own ...string) (*costWindow, error) {
	conn, err := pgx.Connect(ctx, withApplicationName(adminURL, componentMonitor))
	if err != nil {
		return nil, fmt.Errorf("cost: connect as admin: %w", err)
	}
	w := &costWindow{m: m, conn: conn, own: own, profile: &bytes.Buffer{}}
	// The profile starts first and the readings follow, so that the
	// readings' own cost falls outside what the profile splits.
	w.profiled = pprof.StartCPUProfile(w.profile) == nil
	if err := w.read(ctx, func(pg map[int]pgProcess, self, broker, disk float64, wire map[string][2]float64, lsn uint64) {
		w.pg, w.self, w.broker, w.disk, w.wire, w.lsn = pg, self, broker, disk, wire, lsn
	}); err != nil {
		w.close(ctx)
		return nil, err
	}
	return w, nil
}

// close ends the window without a sample.
func (w *costWindow) close(ctx context.Context) {
	if w.profiled {
		pprof.StopCPUProfile()
		w.profiled = false
	}
	_ = w.conn.Close(context.WithoutCancel(ctx))
}

// stop ends the window and returns its cost over events handled.
func (w *costWindow) stop(ctx context.Context, events int64) (costSample, error) {
	s := costSample{Events: events, CPU: map[string]float64{}}
	var pg map[int]pgProcess
	var self float64
	err := w.read(ctx, func(p map[int]pgProcess, se, broker, disk float64, wire map[string][2]float64, lsn uint64) {
		pg, self = p, se
		if w.m.broker != 0 {
			s.CPU[termBroker] = broker - w.broker
			s.BrokerDisk = disk - w.disk
		}
		for k, now := range wire {
			before := w.wire[k] // a connection opened in the window counts whole
			s.BrokerIn += now[0] - before[0]
			s.BrokerOut += now[1] - before[1]
		}
		s.WAL = float64(lsn - w.lsn)
	})
	profiled := w.profiled
	if profiled {
		pprof.StopCPUProfile()
		w.profiled = false
	}
	w.close(ctx)
	if err != nil {
		return costSample{}, err
	}
	for pid, now := range pg {
		// A process started in the window counts from its start; one that
		// ended in it is not seen (pools keep their sessions).
		d := now.cpu - w.pg[pid].cpu
		if now.term == "" {
			s.Excluded += d
			continue
		}
		s.CPU[now.term] += d
	}
	bench := self - w.self
	if !profiled {
		s.CPU[termBench] = bench
		return s, nil
	}
	shares, err := labelShares(w.profile.Bytes())
	if err != nil {
		return costSample{}, fmt.Errorf("cost: read the CPU profile: %w", err)
	}
	for _, c := range []struct{ label, term string }{
		{componentProducers, termProducers}, {componentRelay, termRelay}, {componentConsumer, termConsumer}, {"", termRuntime},
	} {
		s.CPU[c.term] = shares[c.label] * bench
	}
	s.Excluded += shares[componentMonitor] * bench
	return s, nil
}

// read takes every reading of the window: PostgreSQL's processes, the bench
// process, the broker's CPU time and disk writes, the bytes of the
// connections to the broker, and the WAL position.
func (w *costWindow) read(ctx context.Context, got func(pg map[int]pgProcess, self, broker, disk float64, wire map[string][2]float64, lsn uint64)) error {
	var lsnText string
	if err := w.conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsnText); err != nil {
		return fmt.Errorf("cost: read the WAL position: %w", err)
	}
	lsn, err := parseLSN(lsnText)
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	pg := map[int]pgProcess{}
	if w.m.postmaster != 0 {
		if pg, err = w.pgProcesses(ctx); err != nil {
			return err
		}
	}
	self, err := readProcStat(os.Getpid())
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	var broker, disk float64
	if w.m.broker != 0 {
		st, err := readProcStat(w.m.broker)
		if err != nil {
			return fmt.Errorf("cost: the broker's process: %w", err)
		}
		broker = st.cpu
		disk, _ = readWriteBytes(w.m.broker) // 0 when not readable: no disk figure
	}
	wire, err := brokerSockets(w.m.amqpPort)
	if err != nil {
		wire = nil
	}
	got(pg, self.cpu, broker, disk, wire, lsn)
	return nil
}

// pgProcesses reads the CPU time of every child of the postmaster (and the
// postmaster's own) and sorts each into its term by pg_stat_activity.
func (w *costWindow) pgProcesses(ctx context.Context) (map[int]pgProcess, error) {
	type activity struct{ backendType, database, app string }
	acts := map[int]activity{}
	rows, err := w.conn.Query(ctx, `SELECT pid, coalesce(backend_type, ''), coalesce(datname, ''), coalesce(application_name, '') FROM pg_stat_activity`)
	if err != nil {
		return nil, fmt.Errorf("cost: read pg_stat_activity: %w", err)
	}
	for rows.Next() {
		var pid int
		var a activity
		if err := rows.Scan(&pid, &a.backendType, &a.database, &a.app); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cost: read pg_stat_activity: %w", err)
		}
		acts[pid] = a
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cost: read pg_stat_activity: %w", err)
	}
	own := func(db string) bool {
		for _, o := range w.own {
			if o == db {
				return true
			}
		}
		return false
	}
	procs, err := childProcesses(w.m.postmaster)
	if err != nil {
		return nil, fmt.Errorf("cost: PostgreSQL's processes: %w", err)
	}
	out := map[int]pgProcess{}
	for pid, st := range procs {
		a, known := acts[pid]
		term := termPGServer
		switch {
		case !known || (a.backendType != "client backend" && a.backendType != "walsender"):
			// The postmaster, writers, checkpointer, autovacuum: the server.
		case !own(a.database):
			term = "" // another database's session
		case a.backendType == "walsender" || a.app == appNames[componentRelay]:
			term = termPGRelay
		case a.app == appNames[componentProducers]:
			term = termPGProducers
		case a.app == appNames[componentConsumer]:
			term = termPGConsumer
		default:
			term = "" // the bench's own sessions: checks, monitors
		}
		out[pid] = pgProcess{cpu: st.cpu, term: term}
	}
	return out, nil
}

// labelShares returns, from a CPU profile, each component label's share of
// the CPU time sampled; the share without a label is under "".
func labelShares(data []byte) (map[string]float64, error) {
	p, err := profile.ParseData(data)
	if err != nil {
		return nil, err
	}
	idx := len(p.SampleType) - 1 // cpu nanoseconds
	sums := map[string]float64{}
	var total float64
	for _, s := range p.Sample {
		v := float64(s.Value[idx])
		label := ""
		if ls := s.Label[componentLabel]; len(ls) > 0 {
			label = ls[0]
		}
		sums[label] += v
		total += v
	}
	if total == 0 {
		return map[string]float64{"": 1}, nil
	}
	for k := range sums {
		sums[k] /= total
	}
	return sums, nil
}

// procStat is what the cost reads of /proc/PID/stat.
type procStat struct {
	comm string
	ppid int
	cpu  float64 // utime + stime, seconds
}

// clockTicks is the unit of /proc/PID/stat's times (USER_HZ): 100 on every
// Linux architecture Go supports.
const clockTicks = 100

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(string(b))
}

// parseProcStat parses a /proc/PID/stat line: the command name is between
// the first '(' and the last ')', since it may hold both.
func parseProcStat(line string) (procStat, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("malformed /proc stat %q", line)
	}
	f := strings.Fields(line[end+1:])
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return procStat{}, fmt.Errorf("malformed /proc stat %q", line)
	}
	ppid, err1 := strconv.Atoi(f[1])
	utime, err2 := strconv.ParseFloat(f[11], 64)
	stime, err3 := strconv.ParseFloat(f[12], 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return procStat{}, fmt.Errorf("malformed /proc stat %q: %w", line, err)
	}
	return procStat{comm: line[open+1 : end], ppid: ppid, cpu: (utime + stime) / clockTicks}, nil
}

// childProcesses returns parent and its children with their stat.
func childProcesses(parent int) (map[int]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int]procStat{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readProcStat(pid)
		if err != nil {
			continue // ended meanwhile
		}
		if pid == parent || st.ppid == parent {
			out[pid] = st
		}
	}
	if _, ok := out[parent]; !ok {
		return nil, fmt.Errorf("process %d is gone", parent)
	}
	return out, nil
}

// readWriteBytes returns write_bytes of /proc/PID/io.
func readWriteBytes(pid int) (float64, error) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "io"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no write_bytes in /proc/%d/io", pid)
}

// listeningProcess returns the process listening on TCP port (decimal) on
// this machine: the inode of its socket from /proc/net/tcp{,6}, then the
// process holding that socket.
func listeningProcess(port string) (int, error) {
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q: %w", port, err)
	}
	hexPort := fmt.Sprintf(":%04X", n)
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// local_address is f[1], st f[3] (0A: LISTEN), inode f[9].
			if len(f) > 9 && strings.HasSuffix(f[1], hexPort) && f[3] == "0A" {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no process of this machine listens on port %s", port)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join("/proc", p.Name(), "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && inodes[target] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("the process listening on port %s is not readable", port)
}

// brokerSockets returns, by local address, the bytes sent and received on
// this machine's established connections to port, as ss reports them from
// the kernel's tcp_info.
func brokerSockets(port string) (map[string][2]float64, error) {
	out, err := exec.Command("ss", "-tinH", "state", "established", "( dport = :"+port+" )").Output()
	if err != nil {
		return nil, err
	}
	return parseSS(string(out)), nil
}

// parseSS reads ss -tinH output: a line naming a socket's addresses, then
// an indented line of its tcp_info.
func parseSS(out string) map[string][2]float64 {
	sockets := map[string][2]float64{}
	local := ""
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			f := strings.Fields(line)
			local = ""
			if len(f) >= 4 {
				local = f[2]
			}
			continue
		}
		if local == "" {
			continue
		}
		var v [2]float64
		for _, field := range strings.Fields(line) {
			if x, ok := strings.CutPrefix(field, "bytes_sent:"); ok {
				v[0], _ = strconv.ParseFloat(x, 64)
			} else if x, ok := strings.CutPrefix(field, "bytes_received:"); ok {
				v[1], _ = strconv.ParseFloat(x, 64)
			}
		}
		sockets[local] = v
		local = ""
	}
	return sockets
}

// parseLSN parses a PostgreSQL LSN ("16/B374D848").
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("malformed LSN %q", s)
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("malformed LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// perEvent divides every term of s by its events: µs of CPU and bytes.
func (s costSample) perEvent() (cpu map[string]float64, total, wal, wire, disk float64) {
	cpu = map[string]float64{}
	if s.Events <= 0 {
		return cpu, 0, 0, 0, 0
	}
	n := float64(s.Events)
	for term, sec := range s.CPU {
		cpu[term] = sec * 1e6 / n
		total += cpu[term]
	}
	return cpu, total, s.WAL / n, (s.BrokerIn + s.BrokerOut) / n, s.BrokerDisk / n
}

// String renders the per-event terms of s for a progress line.
func (s costSample) String() string {
	cpu, total, wal, wire, disk := s.perEvent()
	var parts []string
	for _, t := range costTerms {
		if v, ok := cpu[t]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", t, v))
		}
	}
	return fmt.Sprintf("CPU %.0f µs/event (%s); WAL %.0f B, broker %.0f B on the wire, %.0f B to disk per event",
		total, strings.Join(parts, ", "), wal, wire, disk)
}

// Names of the cost figures. The CPU time of each term is a figure of its
// own, named costTermPrefix + term, which the report shows as a matrix.
const (
	figCostCPU     = "CPU per event"
	figCostWAL     = "WAL per event"
	figCostWire    = "broker bytes per event"
	figCostDisk    = "broker disk writes per event"
	costTermPrefix = "CPU per event: "
	// figCostWireTo and figCostWireFrom split figCostWire by direction;
	// like the terms of the CPU time, the report shows them in the matrix.
	figCostWireTo   = figCostWire + ": to the broker"
	figCostWireFrom = figCostWire + ": from the broker"
)

// inMatrixOnly reports whether the figure named name is shown in the cost
// matrix only, not as a row of the table.
func inMatrixOnly(name string) bool {
	return strings.HasPrefix(name, costTermPrefix) || name == figCostWireTo || name == figCostWireFrom
}

// wireTo and wireFrom return the bytes per event sent to the broker and
// received from it.
func (s costSample) wireTo() float64 {
	if s.Events <= 0 {
		return 0
	}
	return s.BrokerIn / float64(s.Events)
}

func (s costSample) wireFrom() float64 {
	if s.Events <= 0 {
		return 0
	}
	return s.BrokerOut / float64(s.Events)
}

// figDrainCPU names the drain's cost figure, and figDrainWire the bytes
// sent to the broker per event published in the drain.
const (
	figDrainCPU  = "drain: CPU per event"
	figDrainWire = "drain: bytes to the broker per event"
)

// drainFigures turns the cost samples of a variant's drains into a figure:
// the CPU time per event published, with the terms (medians, those of at
// least 1 µs) in its note. While a relay drains, only the relay, its
// sessions and the broker work: the terms show what a backlog costs each.
func (m *costMeter) drainFigures(variant string, samples []costSample) []Figure {
	if len(samples) == 0 {
		return nil
	}
	var totals, wire []float64
	terms := map[string][]float64{}
	for _, s := range samples {
		cpu, total, _, _, _ := s.perEvent()
		totals, wire = append(totals, total), append(wire, s.wireTo())
		for t, v := range cpu {
			terms[t] = append(terms[t], v)
		}
	}
	f := newFigure(GroupDrain, figDrainCPU, variant, "µs/event", totals)
	var parts []string
	for _, t := range costTerms {
		if v := terms[t]; len(v) > 0 {
			if _, med := summary(v); med >= 1 {
				parts = append(parts, fmt.Sprintf("%s %.0f", t, med))
			}
		}
	}
	f.Note = strings.Join(parts, ", ")
	figs := []Figure{f}
	if m.ss {
		// Only the relay publishes while it drains: its messages, per event.
		w := newFigure(GroupDrain, figDrainWire, variant, "B/event", wire)
		w.Note = "sent on this machine's connections to the broker (ss), per event published"
		figs = append(figs, w)
	}
	return figs
}

// figures turns the cost samples of a variant's repetitions into figures:
// the CPU time per event in all and by term, the WAL, and what went
// through the broker, per event.
func (m *costMeter) figures(variant string, samples []costSample) []Figure {
	if len(samples) == 0 {
		return nil
	}
	var totals, wal, wire, wireTo, wireFrom, disk []float64
	terms := map[string][]float64{}
	for i, s := range samples {
		cpu, total, w, b, d := s.perEvent()
		totals, wal, wire, disk = append(totals, total), append(wal, w), append(wire, b), append(disk, d)
		wireTo, wireFrom = append(wireTo, s.wireTo()), append(wireFrom, s.wireFrom())
		for _, t := range costTerms {
			if v, ok := cpu[t]; ok {
				for len(terms[t]) < i {
					terms[t] = append(terms[t], 0)
				}
				terms[t] = append(terms[t], v)
			}
		}
	}
	total := newFigure(GroupCost, figCostCPU, variant, "µs/event", totals)
	figs := []Figure{total, newFigure(GroupCost, figCostWAL, variant, "B/event", wal)}
	if m.ss {
		f := newFigure(GroupCost, figCostWire, variant, "B/event", wire)
		f.Note = "to and from the broker"
		figs = append(figs, f,
			newFigure(GroupCost, figCostWireTo, variant, "B/event", wireTo),
			newFigure(GroupCost, figCostWireFrom, variant, "B/event", wireFrom))
	}
	if m.broker != 0 {
		figs = append(figs, newFigure(GroupCost, figCostDisk, variant, "B/event", disk))
	}
	for _, t := range costTerms {
		if v := terms[t]; len(v) > 0 {
			for len(v) < len(samples) {
				v = append(v, 0)
			}
			figs = append(figs, newFigure(GroupCost, costTermPrefix+t, variant, "µs/event", v))
		}
	}
	return figs
}
