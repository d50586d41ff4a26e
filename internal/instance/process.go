package instance

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// markerEnv is set on every server process the package starts, to the
// directory of its instance, which is also the process's working directory.
// Children inherit both, so that every process of an instance (the
// PostgreSQL postmaster and its backends, the RabbitMQ start script, its
// Erlang VM and the VM's helpers) can be found from /proc, also by a later
// run after the test process that started them died.
const markerEnv = "OUTBOXMILL_INSTANCE"

// rootPrefix starts the names of the instances' directories in
// os.TempDir().
const rootPrefix = "outboxmill-instance-"

// ownerFile, in an instance's root directory, names the process that owns
// it: its pid and its start time (field 22 of /proc/<pid>/stat).
const ownerFile = "owner"

// process is one server process the package started, with the log its
// output goes to.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// startProcess starts bin with args, its output appended to logPath,
// carrying the marker of the instance in dir, as cred (nil: as this
// process's user), in a process group of its own.
func startProcess(bin string, args, env []string, dir, logPath string, cred *syscall.Credential) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnviron(), env...)
	cmd.Env = append(cmd.Env, markerEnv+"="+dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// cleanEnviron is this process's environment without the variables that
// would point a server or a client at another instance.
func cleanEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PG") || strings.HasPrefix(name, "RABBITMQ_") || strings.HasPrefix(name, "ERL_") ||
			name == markerEnv || name == "HOME" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to timeout for the process to exit and reports whether it
// did.
func (p *process) wait(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// signal sends sig to the process unless it has exited.
func (p *process) signal(sig syscall.Signal) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// markedProcesses returns the pids of the live processes of the instance in
// dir: those whose working directory is dir or below it (PostgreSQL's
// postmaster and backends work in the data directory), and those carrying
// the marker of dir or, with under, of a directory below it (instance
// directories are never nested: under is for the reaper's sake) (PostgreSQL
// overwrites its processes' environment with their titles; RabbitMQ's keep
// theirs). Zombies have neither and are not returned.
func markedProcesses(dir string, under bool) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(markerEnv + "=" + dir)
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		// epmd, which a first Erlang node starts when none runs, outlives
		// the node and serves every node of the machine.
		if comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm"); string(bytes.TrimSpace(comm)) == "epmd" {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && inDir(cwd, dir) {
			pids = append(pids, pid)
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.Equal(kv, want) || under && bytes.HasPrefix(kv, append(want, '/')) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// inDir reports whether path is dir or below it.
func inDir(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// killMarked kills (SIGKILL) every process of the instance in dir (with
// under, of the instances below it too) and waits until none is left. It
// first stops them all (SIGSTOP), so that none runs another instruction,
// forks or notices the others dying before it dies itself: as in a crash of
// the machine, not an orderly exit.
func killMarked(dir string, under bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	killed := map[int]bool{}
	for {
		pids := markedProcesses(dir, under)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			killed[pid] = true
		}
		// A process that is exiting may already have lost its memory
		// (environment) but not yet its files (a listening socket): it is
		// gone once it is a zombie.
		var alive []int
		for pid := range killed {
			if !exitedPID(pid) {
				alive = append(alive, pid)
			}
		}
		if len(alive) == 0 && len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v of %s still alive after SIGKILL", alive, dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exitedPID reports whether process pid no longer exists or is a zombie
// (it has exited: its memory and files are released).
func exitedPID(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	state := b[i+2]
	return state == 'Z' || state == 'X'
}

// ports hands out loopback ports: each one free when handed out and never
// handed out twice by this process.
var ports struct {
	sync.Mutex
	given map[int]bool
}

// reservedPorts are ports that tools bind on their own: the ports
// rabbitmqctl's own Erlang distribution takes (35672-35682), the shared
// broker's and PostgreSQL's.
func reservedPort(p int) bool {
	return p >= 35672 && p <= 35682 || p == 4369 || p == 5432 || p == 5672 || p == 25672
}

// freePort returns a loopback TCP port that was free a moment ago, chosen
// outside the kernel's ephemeral range (ip_local_port_range): the kernel
// never hands such a port to a bind to port 0 or to an outgoing connection,
// so while a killed server is down nothing but another explicit bind can
// take its port (the short-lived Erlang nodes rabbitmqctl starts listen on
// ephemeral ports, many times a second while the suite runs). A server that
// then fails to bind it is started again on another (see the callers).
func freePort() (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
	}
	lo, hi := privatePortRange()
	for range 1000 {
		port := lo + rand.IntN(hi-lo+1)
		if ports.given[port] || reservedPort(port) {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		l.Close()
		ports.given[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("pick a free port: none free in %d-%d after 1000 tries", lo, hi)
}

// privatePortRange returns the range freePort picks from: the ports below
// the kernel's ephemeral range down to 10000, or those above it when the
// range starts too low to leave room below.
func privatePortRange() (lo, hi int) {
	first, last := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if a, err := strconv.Atoi(f[0]); err == nil {
				if z, err := strconv.Atoi(f[1]); err == nil {
					first, last = a, z
				}
			}
		}
	}
	switch {
	case first-1 >= 10000+1000:
		return 10000, first - 1
	case last+1 <= 65535-1000:
		return last + 1, 65535
	default: // no room outside the range: pick from all of it
		return 10000, 65535
	}
}

// processStart returns the start time of process pid (in clock ticks since
// boot), or "" if there is no such process.
func processStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return ""
	}
	fields := strings.Fields(string(b[i+1:]))
	// fields[0] is field 3 (state): start time, field 22, is fields[19].
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}

// newRoot creates the root directory of a new instance, recording this
// process as its owner, after removing what instances of dead owners left
// behind.
func newRoot(kind string) (string, error) {
	reapOnce.Do(reapLeftovers)
	dir, err := os.MkdirTemp("", rootPrefix+kind+"-")
	if err != nil {
		return "", fmt.Errorf("create instance directory: %w", err)
	}
	owner := fmt.Sprintf("%d %s\n", os.Getpid(), processStart(os.Getpid()))
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("create instance directory: %w", err)
	}
	return dir, nil
}

var reapOnce sync.Once

// reapLeftovers kills the processes of, and removes, the instance
// directories whose owner process is gone: what a test binary that was
// killed, or crashed, before its clean-up ran left behind. Instances of
// live owners (another test binary running now) are left alone.
func reapLeftovers() {
	roots, _ := filepath.Glob(filepath.Join(os.TempDir(), rootPrefix+"*"))
	for _, root := range roots {
		b, err := os.ReadFile(filepath.Join(root, ownerFile))
		if err == nil {
			var pid int
			var start string
			if _, err := fmt.Sscan(string(b), &pid, &start); err == nil && processStart(pid) == start {
				continue // its owner still runs
			}
		} else if info, err := os.Stat(root); err != nil || time.Since(info.ModTime()) < time.Minute {
			continue // being created right now, or gone
		}
		if err := killMarked(root, true, 10*time.Second); err != nil {
			continue
		}
		_ = os.RemoveAll(root)
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pollUntil calls ready every interval until it returns nil, the process
// exits, or timeout passes.
func pollUntil(p *process, timeout, interval time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("exited (%v) before it was ready (last error: %v)", p.err, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", timeout, err)
		}
		select {
		case <-p.done:
		case <-time.After(interval):
		}
	}
}

// listeningProcesses returns the processes holding a socket that listens
// on 127.0.0.1 or any address at TCP port, from /proc.
func listeningProcesses(port int) []int {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st ... inode (field 9)
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			if i := strings.LastIndexByte(f[1], ':'); i >= 0 && f[1][i+1:] == fmt.Sprintf("%04X", port) {
				inodes["socket:["+f[9]+"]"] = true
			}
		}
	}
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir("/proc/" + p.Name() + "/fd")
		for _, fd := range fds {
			if link, err := os.Readlink("/proc/" + p.Name() + "/fd/" + fd.Name()); err == nil && inodes[link] {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// errNotOurs means a server answered on an instance's port, but the
// listener is not a process of the instance: another test's server took
// the port, picked at the same time in another process, and the
// instance's own server failed to bind it.
var errNotOurs = errors.New("the listener on the port is not a process of the instance")

// listensHere returns nil if a process of the instance in dir listens on
// port, errNotOurs otherwise.
func listensHere(dir string, port int) error {
	ours := markedProcesses(dir, false)
	for _, pid := range listeningProcesses(port) {
		if slices.Contains(ours, pid) {
			return nil
		}
	}
	return fmt.Errorf("port %d: %w", port, errNotOurs)
}
