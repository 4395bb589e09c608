package linuxvm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rnic-dev/rnic/internal/childproc"
)

// Variant selects which siw build the guest loads.
type Variant string

const (
	// Stock is Linux siw as shipped: MPA revision 2 with RFC 6581 enhanced
	// connection setup, CRC not required, no markers.
	Stock Variant = "stock"
	// CRC1 is siw built with MPA revision 1 and CRC required.
	CRC1 Variant = "crc1"
)

// Guest and host addresses as seen from inside the VM (QEMU user networking).
const (
	GuestIP = "10.0.2.15"
	HostIP  = "10.0.2.2"
)

// DefaultTimeout bounds a VM's run when Config.Timeout is zero.
const DefaultTimeout = 5 * time.Minute

// Config describes one VM run.
type Config struct {
	CacheDir    string  // built VM (see Ensure); "" means DefaultCacheDir
	Variant     Variant // siw build; "" means Stock
	GuestScript string  // shell script run in the guest as /host/guest.sh
	ShareDir    string  // host directory mounted at /host; "" means a fresh temporary one
	Forwards    []int   // ports P forwarded host 127.0.0.1:P -> guest 10.0.2.15:P
	Timeout     time.Duration
	KernelArgs  []string          // appended to the kernel command line
	PCAP        string            // if set, pcap file of the guest NIC's traffic
	MemoryMiB   int               // guest memory; 0 means 1024
	Log         func(line string) // called with each guest output line as it arrives
}

// Result is what a finished VM run produced.
type Result struct {
	Lines    []string      // guest output lines (status lines start with "RNICVM: ")
	ExitCode int           // guest.sh exit status; -1 if the guest never reported one
	Ready    time.Duration // from start until the guest was about to run guest.sh
	Total    time.Duration // from start until QEMU exited
	Console  string        // kernel console log
}

// ExitError reports that guest.sh exited with a non-zero status.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("linuxvm: guest script exited %d", e.Code) }

// ErrNoExit reports that the VM stopped without the guest reporting guest.sh's
// exit status (killed, timed out, kernel panic, or a broken initramfs).
var ErrNoExit = errors.New("linuxvm: VM stopped without a guest exit status")

// VM is one running QEMU guest.
type VM struct {
	cmd     *exec.Cmd
	cancel  context.CancelFunc
	start   time.Time
	tmp     string // removed by Wait
	console string
	stderr  bytes.Buffer // QEMU's own messages

	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever lines grows or the VM ends
	lines   []string
	ready   time.Duration
	exit    int
	ended   bool

	done    chan struct{} // closed when QEMU has exited and output is drained
	waitErr error
}

const statusPrefix = "RNICVM: "

// Boot starts a VM as cfg says. The caller must call Wait (or Stop then Wait).
func Boot(ctx context.Context, cfg Config) (*VM, error) {
	var err error
	if cfg.CacheDir == "" {
		if cfg.CacheDir, err = DefaultCacheDir(); err != nil {
			return nil, err
		}
	}
	run := filepath.Join(cfg.CacheDir, "run-vm.sh")
	if _, err := os.Stat(run); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotBuilt, err)
	}
	switch cfg.Variant {
	case "":
		cfg.Variant = Stock
	case Stock, CRC1:
	default:
		return nil, fmt.Errorf("linuxvm: unknown variant %q (want %q or %q)", cfg.Variant, Stock, CRC1)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MemoryMiB <= 0 {
		cfg.MemoryMiB = 1024
	}
	tmp, err := os.MkdirTemp("", "linuxvm-*")
	if err != nil {
		return nil, fmt.Errorf("linuxvm: %w", err)
	}
	share := cfg.ShareDir
	if share == "" {
		share = filepath.Join(tmp, "share")
		if err := os.Mkdir(share, 0o755); err != nil {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("linuxvm: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(share, "guest.sh"), []byte(cfg.GuestScript), 0o755); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("linuxvm: write guest.sh: %w", err)
	}
	fwd := make([]string, len(cfg.Forwards))
	for i, p := range cfg.Forwards {
		if p <= 0 || p > 65535 {
			os.RemoveAll(tmp)
			return nil, fmt.Errorf("linuxvm: bad forward port %d", p)
		}
		fwd[i] = strconv.Itoa(p)
	}

	// The run-vm.sh timeout (SIGKILL to QEMU) backs up the context deadline.
	rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	vm := &VM{cancel: cancel, tmp: tmp, console: filepath.Join(tmp, "console.log"),
		changed: make(chan struct{}), exit: -1, done: make(chan struct{}), start: time.Now()}
	args := append([]string{run, share}, cfg.KernelArgs...)
	cmd := exec.CommandContext(rctx, "bash", args...)
	cmd.Env = append(os.Environ(),
		"RNICVM_SIW="+string(cfg.Variant),
		"RNICVM_FORWARDS="+strings.Join(fwd, " "),
		"RNICVM_TIMEOUT="+strconv.Itoa(int(cfg.Timeout/time.Second)+10),
		"RNICVM_CONSOLE="+vm.console,
		"RNICVM_PCAP="+cfg.PCAP,
		"RNICVM_MEM="+strconv.Itoa(cfg.MemoryMiB),
	)
	// run-vm.sh execs timeout(1), which puts itself and QEMU in a new process
	// group led by cmd's pid: cancel kills that whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	childproc.DieWithParent(cmd, syscall.SIGTERM)
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Stderr = &limitedWriter{b: &vm.stderr, max: 64 << 10}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("linuxvm: %w", err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("linuxvm: start qemu: %w", err)
	}
	vm.cmd = cmd
	go vm.read(out, cfg.Log)
	return vm, nil
}

// read collects output lines until QEMU closes its standard output, then
// reaps the process.
func (vm *VM) read(r io.Reader, log func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if log != nil {
			log(line)
		}
		vm.mu.Lock()
		vm.lines = append(vm.lines, line)
		if rest, ok := strings.CutPrefix(line, statusPrefix); ok {
			if strings.HasPrefix(rest, "ready") && vm.ready == 0 {
				vm.ready = time.Since(vm.start)
			}
			if v, ok := strings.CutPrefix(rest, "exit="); ok {
				if n, err := strconv.Atoi(v); err == nil {
					vm.exit = n
				}
			}
		}
		vm.broadcastLocked()
		vm.mu.Unlock()
	}
	if sc.Err() != nil {
		io.Copy(io.Discard, r) // a giant line: keep QEMU from blocking on a full pipe
	}
	err := vm.cmd.Wait()
	vm.cancel()
	vm.mu.Lock()
	vm.ended = true
	vm.waitErr = err
	vm.broadcastLocked()
	vm.mu.Unlock()
	close(vm.done)
}

func (vm *VM) broadcastLocked() {
	close(vm.changed)
	vm.changed = make(chan struct{})
}

// Lines returns the guest output lines received so far.
func (vm *VM) Lines() []string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]string(nil), vm.lines...)
}

// WaitFor waits until some guest output line (received before or after the
// call) contains substr and returns the first such line. It fails if the VM
// ends first or ctx is done.
func (vm *VM) WaitFor(ctx context.Context, substr string) (string, error) {
	seen := 0
	for {
		vm.mu.Lock()
		for ; seen < len(vm.lines); seen++ {
			if strings.Contains(vm.lines[seen], substr) {
				l := vm.lines[seen]
				vm.mu.Unlock()
				return l, nil
			}
		}
		ended, ch := vm.ended, vm.changed
		vm.mu.Unlock()
		if ended {
			return "", fmt.Errorf("linuxvm: VM ended before a line with %q: %w", substr, ErrNoExit)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return "", fmt.Errorf("linuxvm: waiting for %q: %w", substr, ctx.Err())
		}
	}
}

// Stop kills the VM. Wait must still be called to collect the result.
func (vm *VM) Stop() { vm.cancel() }

// Wait waits for the VM to power off (or be killed) and returns what it
// printed. The error is nil only if guest.sh ran and exited 0; an
// *ExitError carries a non-zero exit status. The Result is filled in either way.
func (vm *VM) Wait() (*Result, error) {
	<-vm.done
	res := &Result{Total: time.Since(vm.start)}
	if b, err := os.ReadFile(vm.console); err == nil {
		res.Console = string(b)
	}
	os.RemoveAll(vm.tmp)
	vm.mu.Lock()
	res.Lines = append([]string(nil), vm.lines...)
	res.ExitCode, res.Ready = vm.exit, vm.ready
	waitErr := vm.waitErr
	vm.mu.Unlock()
	switch {
	case res.ExitCode < 0:
		return res, fmt.Errorf("%w (qemu: %v; %s; console tail: %s)", ErrNoExit, waitErr,
			bytes.TrimSpace(vm.stderr.Bytes()), lastBytes([]byte(res.Console), 2048))
	case res.ExitCode != 0:
		return res, &ExitError{Code: res.ExitCode}
	}
	return res, nil
}

// Run boots a VM and waits for it.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	vm, err := Boot(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return vm.Wait()
}

// limitedWriter keeps the first max bytes written to it.
type limitedWriter struct {
	mu  sync.Mutex
	b   *bytes.Buffer
	max int
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - w.b.Len(); room > 0 {
		w.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
