// Package stack starts the sample modules as real processes against real
// PostgreSQL and RabbitMQ, as the orders and settlement services or as one
// monolith process (Config.Monolith), each run in its own databases and
// broker namespace, and removes what it created. The demo, the end-to-end and
// fault-injection tests and the benchmark use it.
package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
)

// Env holds the servers a stack runs against (see testenv.Env).
type Env = testenv.Env

// EnvFromEnvironment reads the servers from the environment (see
// testenv.FromEnvironment).
func EnvFromEnvironment() Env { return testenv.FromEnvironment() }

// UniqueName returns prefix followed by random hex (see testenv.UniqueName).
func UniqueName(prefix string) string { return testenv.UniqueName(prefix) }

// DeleteBrokerObjects deletes the exchanges and queues of the sample
// modules' topology in namespace ns.
func DeleteBrokerObjects(ctx context.Context, e Env, ns string) error {
	t, err := Topology(ns)
	if err != nil {
		return err
	}
	return rabbitmq.Delete(ctx, e.AMQPURL, t)
}

// Topology is the broker topology of the sample modules in namespace ns.
func Topology(ns string) (rabbitmq.Topology, error) {
	return modules.Samples().Topology(module.Names{Namespace: ns}, "")
}

// Build compiles the named commands (./cmd/<name>) into dir. moduleDir is
// the module's root. A stack starts orders and settlement, or monolith in
// monolith mode (Config.Commands, ServiceCommands for both).
func Build(ctx context.Context, moduleDir, dir string, commands ...string) error {
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, c := range commands {
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// ModuleDir finds the module root by walking up from the working directory.
func ModuleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Process is a service started as a child process.
type Process struct {
	// Name is the command's name ("orders", "settlement", "monolith").
	Name string
	// Addr is the HTTP address the service announced.
	Addr string

	bin     string
	args    []string
	env     []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// running matches the line a service logs once it serves:
// msg="outboxmill service running" http_addr=127.0.0.1:41234 modules=...
var running = regexp.MustCompile(`service running" http_addr=(\S+)`)

// Start starts the command bin with args and extra environment env, appending
// its output to logPath, and waits until it announces its HTTP address.
func Start(ctx context.Context, bin string, args, env []string, logPath string) (*Process, error) {
	p := &Process{Name: filepath.Base(bin), bin: bin, args: args, env: env, logPath: logPath}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Process) start(ctx context.Context) error {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	if p.Addr != "" {
		// A restart: keep the address clients know.
		cmd.Env = append(cmd.Env, "HTTP_ADDR="+p.Addr)
	}
	cmd.Stdout = logFile
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done, p.err = cmd, done, nil
	p.mu.Unlock()

	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if m := running.FindStringSubmatch(line); m != nil {
				select {
				case addr <- m[1]:
				default:
				}
			}
		}
		_, _ = io.Copy(logFile, pr)
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
		logFile.Close()
	}()

	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	select {
	case a := <-addr:
		p.Addr = a
		return nil
	case <-done:
		return fmt.Errorf("%s exited before serving (%v); see %s:\n%s", p.Name, p.exitErr(), p.logPath, tail(p.logPath, 20))
	case <-ctx.Done():
		p.Kill()
		return ctx.Err()
	case <-timeout.C:
		p.Kill()
		return fmt.Errorf("%s did not start within 60 s; see %s", p.Name, p.logPath)
	}
}

func (p *Process) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// URL returns the service's base URL.
func (p *Process) URL() string { return "http://" + p.Addr }

// Kill sends SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL)
	p.Wait()
}

// Stop sends SIGTERM and waits for a graceful exit, returning its error.
func (p *Process) Stop() error {
	p.signal(syscall.SIGTERM)
	p.Wait()
	return p.exitErr()
}

// Pause sends SIGSTOP: the process is frozen, as a stalled VM would be,
// with its connections left open, until Resume. Kill still ends it.
func (p *Process) Pause() { p.signal(syscall.SIGSTOP) }

// Resume sends SIGCONT to a process frozen by Pause.
func (p *Process) Resume() { p.signal(syscall.SIGCONT) }

// Wait waits for the process to exit.
func (p *Process) Wait() {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Restart starts the process again with the same arguments and environment
// after it exited, listening on the HTTP address it had (HTTP_ADDR), so that
// clients can keep their URL across a crash and restart. A flag naming
// another address in the arguments still wins.
func (p *Process) Restart(ctx context.Context) error {
	if !p.Exited() {
		return fmt.Errorf("restart %s: still running", p.Name)
	}
	return p.start(ctx)
}

// PID returns the process id of the running (or last) process, or 0 if it
// never started.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done:
	default:
		_ = cmd.Process.Signal(sig)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
