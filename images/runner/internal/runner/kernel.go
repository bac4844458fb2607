package runner

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// maxKernelMessageBytes bounds a message from the kernel: a done message
// with a value the kernel cut to maxValueBytes+1 characters, JSON-escaped.
const maxKernelMessageBytes = 1 << 20

// pythonKernel runs as `python3 -c` in a session's interpreter, started by
// the waiting shim (rlimits, seccomp filter, clean env, cwd the work dir). It
// says it is ready on fd 3 and then serves runs over it, one at a time, all
// in ONE __main__ namespace. A run is a message (4-byte big-endian length,
// JSON {"run", "source", "argv"}) carrying the run's stdin, stdout and stderr
// (SCM_RIGHTS); the kernel puts them on fds 0-2, runs the source, flushes,
// puts /dev/null back on fds 0-2 and answers {"run", "exitCode", "value"}
// the same way. See docs/runner-protocol.md, "Session mode".
const pythonKernel = `import ast, json, linecache, os, site, socket, struct, sys
from importlib import invalidate_caches


def _sandpod_kernel():
    # The program runs in this interpreter: keep private references to what
    # the loop needs, so that what it rebinds or deletes does not break it.
    channel = socket.socket(fileno=3)
    os.set_inheritable(3, False)
    receive_fds, recv, sendall = socket.recv_fds, channel.recv, channel.sendall
    pack, unpack, loads, dumps = struct.pack, struct.unpack, json.loads, json.dumps
    dup2, close, exit_now, isdir = os.dup2, os.close, os._exit, os.path.isdir
    waitpid, WNOHANG = os.waitpid, os.WNOHANG
    compile_, exec_, eval_, repr_, open_ = compile, exec, eval, repr, open
    Expr, Expression, ONLY_AST = ast.Expr, ast.Expression, ast.PyCF_ONLY_AST
    lines, addsitedir, invalidate = linecache.cache, site.addsitedir, invalidate_caches
    null = os.open(os.devnull, os.O_RDWR)
    original_stdin, encoding, errors = sys.stdin, sys.stdin.encoding, sys.stdin.errors
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    sys.path[0] = os.getcwd()
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    namespace = main.__dict__

    def detach():
        for fd in (0, 1, 2):
            dup2(null, fd)

    def read_exactly(size, data=b""):
        data = bytearray(data)
        while len(data) < size:
            chunk = recv(min(size - len(data), 1 << 20))
            if not chunk:
                exit_now(0)
            data += chunk
        return bytes(data)

    def receive():
        header, fds, _, _ = receive_fds(channel, 4, 3)
        if not header:
            exit_now(0)
        (size,) = unpack(">I", read_exactly(4, header))
        return loads(read_exactly(size)), fds

    def save_figures():
        # Charts the run showed or left open come back as its output files.
        backend = sys.modules.get("sandpod_mpl")
        if backend is not None:
            try:
                backend.flush()
            except BaseException:
                pass

    def flush():
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except BaseException:
                pass

    def report(error, traceback):
        try:
            sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        except BaseException:
            pass

    def exit_status(code):
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        try:
            print(code, file=sys.stderr)
        except BaseException:
            pass
        return 1

    def run(number, source):
        filename = f"<cell {number}>"
        lines[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            tree = compile_(source, filename, "exec", ONLY_AST, dont_inherit=True)
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], Expr) else None
            body = compile_(tree, filename, "exec", dont_inherit=True)
            trailing = None if last is None else compile_(Expression(last.value), filename, "eval", dont_inherit=True)
        except Exception as error:
            report(error, None)
            return 1, None
        try:
            exec_(body, namespace)
            value = None if trailing is None else eval_(trailing, namespace)
            return 0, None if value is None else repr_(value)[:65537]
        except SystemExit as error:
            return exit_status(error.code), None
        except BaseException as error:
            # The first entry is this frame; the program's start below it.
            report(error, error.__traceback__.tb_next)
            return 1, None

    def reap():
        # The runner killed what the last run started; children of this
        # process stay zombies until it waits for them.
        while True:
            try:
                if waitpid(-1, WNOHANG)[0] == 0:
                    return
            except ChildProcessError:
                return

    detach()
    sendall(b"R")
    while True:
        request, fds = receive()
        reap()
        for fd, target in zip(fds, (0, 1, 2)):
            dup2(fd, target)
            close(fd)
        sys.stdin = sys.__stdin__ = open_(0, encoding=encoding, errors=errors, closefd=False)
        sys.argv = request["argv"]
        if user_site and user_site not in sys.path and isdir(user_site):
            addsitedir(user_site)
        invalidate()
        status, value = run(request["run"], request["source"])
        save_figures()
        flush()
        detach()
        reply = dumps({"run": request["run"], "exitCode": status, "value": value}).encode()
        sendall(pack(">I", len(reply)) + reply)


_sandpod_kernel()
`

// kernelRequest is a run as the kernel receives it; mark only for the node
// kernel (nodekernel.go).
type kernelRequest struct {
	Run    int      `json:"run"`
	Source string   `json:"source"`
	Argv   []string `json:"argv"`
	Mark   string   `json:"mark,omitempty"`
}

// kernelDone is the kernel's answer once a run has ended.
type kernelDone struct {
	Run      int     `json:"run"`
	ExitCode int     `json:"exitCode"`
	Value    *string `json:"value"`
}

// kernel is a session's running interpreter: python, or node (outputs set).
type kernel struct {
	child *warmChild
	conn  *net.UnixConn
	// outputs are the node kernel's stdout and stderr, read for its life;
	// the python kernel gets each run's pipes instead.
	outputs *[2]*markedOutput
	// done carries the kernel's answers; closed when its channel ends or
	// carries anything else.
	done chan kernelDone
	// gone is closed when the kernel is killed.
	gone     chan struct{}
	killOnce sync.Once
}

// startKernel starts the interpreter of served's command with its kernel
// (python's, or node's) and waits until it is ready.
func startKernel(served Config, opts Options) (*kernel, error) {
	argv := []string{served.Command[0], "-c", pythonKernel}
	node := !usesPythonBootstrap(served)
	if node {
		argv = nodeKernelArgv(served)
	}
	child, err := startWaiting(served, opts, nil, argv)
	if err != nil {
		return nil, err
	}
	conn, err := net.FileConn(child.release)
	_ = child.release.Close()
	if err != nil {
		child.abandon()
		return nil, fmt.Errorf("using the kernel's channel: %w", err)
	}
	k := &kernel{child: child, conn: conn.(*net.UnixConn), done: make(chan kernelDone), gone: make(chan struct{})}
	if node {
		// The node kernel's stdin is empty; its stdout and stderr are read here
		// for its life, not by its process's end.
		_ = child.stdin.Close()
		pipes := child.process.pipes
		k.outputs = &[2]*markedOutput{readMarked(pipes.stdoutRead), readMarked(pipes.stderrRead)}
		pipes.stdoutRead, pipes.stderrRead = nil, nil
	}
	go k.receive()
	return k, nil
}

// receive reads the kernel's answers until its channel ends.
func (k *kernel) receive() {
	defer close(k.done)
	for {
		var header [4]byte
		if _, err := io.ReadFull(k.conn, header[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(header[:])
		if size > maxKernelMessageBytes {
			return
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(k.conn, body); err != nil {
			return
		}
		var done kernelDone
		decoder := json.NewDecoder(bytes.NewReader(body))
		decoder.DisallowUnknownFields()
		if decoder.Decode(&done) != nil || done.ExitCode < 0 || done.ExitCode > 255 {
			return
		}
		select {
		case k.done <- done:
		case <-k.gone:
			return
		}
	}
}

// run runs request as run number in the kernel: its result, its value, and
// alive false when the kernel timed out or died and was killed.
func (k *kernel) run(ctx context.Context, cfg Config, request runRequest, number int, frames *frameWriter) (Result, *string, bool) {
	var pipes *runPipes
	if k.outputs == nil {
		var err error
		if pipes, err = newRunPipes(); err != nil {
			return failedResult(err), nil, true
		}
	}
	var value *string
	alive := true
	outputs := outputsDir(k.child.spec.dir)
	if err := resetOutputsDir(outputs); err != nil {
		return failedResult(err), nil, true
	}
	message := kernelRequest{Run: number, Source: request.Source, Argv: append([]string{cfg.SourceFile}, cfg.Args...)}
	bounds := runBounds{timeout: time.Duration(cfg.TimeoutSeconds) * time.Second, memory: uint64(cfg.MemoryLimitBytes)}
	result := runCaptured(cfg, frames, outputs, func(stdout, stderr io.Writer) processOutcome {
		var outcome processOutcome
		if pipes == nil {
			outcome, value, alive = k.exchangeMarked(ctx, message, bounds, stdout, stderr)
		} else {
			outcome, value, alive = k.exchangeOverPipes(ctx, message, pipes, request.Stdin, bounds, stdout, stderr)
		}
		return outcome
	})
	return result, value, alive
}

// exchangeOverPipes runs message in the python kernel, which gets the run's
// own stdin, stdout and stderr.
func (k *kernel) exchangeOverPipes(ctx context.Context, message kernelRequest, pipes *runPipes, stdin *string, bounds runBounds, stdout, stderr io.Writer) (processOutcome, *string, bool) {
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); drain(pipes.stdout[0], stdout) }()
	go func() { defer readers.Done(); drain(pipes.stderr[0], stderr) }()
	go feedStdin(pipes.stdin[1], stdin)
	outcome, value, alive := k.await(ctx, message.Run, bounds, k.send(message, pipes))
	waitOrClose(&readers, drainGrace, pipes.stdout[0], pipes.stderr[0])
	closeAll(pipes.stdout[0], pipes.stderr[0])
	return outcome, value, alive
}

// exchangeMarked runs message in the node kernel, whose output of the run
// lies between the run's marks on its stdout and stderr.
func (k *kernel) exchangeMarked(ctx context.Context, message kernelRequest, bounds runBounds, stdout, stderr io.Writer) (processOutcome, *string, bool) {
	message.Mark = newRunMark()
	k.outputs[0].begin(message.Mark, stdout)
	k.outputs[1].begin(message.Mark, stderr)
	outcome, value, alive := k.await(ctx, message.Run, bounds, k.send(message, nil))
	k.outputs[0].finish(drainGrace)
	k.outputs[1].finish(drainGrace)
	return outcome, value, alive
}

// send hands the kernel its run in the background, with the run's ends of
// the pipes (python's kernel; nil for node's), which it then closes here; the
// channel says how that went.
func (k *kernel) send(message kernelRequest, pipes *runPipes) <-chan error {
	sent := make(chan error, 1)
	body, err := json.Marshal(message)
	if err != nil {
		pipes.closeChildEnds()
		sent <- err
		return sent
	}
	k.child.process.started = time.Now()
	go func() {
		defer pipes.closeChildEnds()
		header := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		var rights []byte
		if pipes != nil {
			rights = syscall.UnixRights(int(pipes.stdin[0].Fd()), int(pipes.stdout[1].Fd()), int(pipes.stderr[1].Fd()))
		}
		if _, _, err := k.conn.WriteMsgUnix(header, rights, nil); err != nil {
			sent <- err
			return
		}
		_, err := k.conn.Write(body)
		sent <- err
	}()
	return sent
}

// runBounds are what a session run may take: its time from the release and
// the memory held by the kernel and everything it started.
type runBounds struct {
	timeout time.Duration
	memory  uint64
}

// await waits for the kernel's answer to run number, the timeout (counted
// from the release), its death or ctx; all but the answer kill it, except a
// cancel on request (errCancelRequested), which interrupts the run as Jupyter
// does (SIGINT: a KeyboardInterrupt in the program, the state kept) and kills
// the kernel only if the run has not ended interruptGrace later.
func (k *kernel) await(ctx context.Context, number int, bounds runBounds, sent <-chan error) (processOutcome, *string, bool) {
	timer := time.NewTimer(bounds.timeout)
	defer timer.Stop()
	spec := k.child.spec
	members := spec.members(k.child.process.pid)
	memory := watchMemory(bounds.memory, members, spec.dir)
	defer memory.end()
	cancelled := ctx.Done()
	var interrupted <-chan time.Time
	for {
		select {
		case err := <-sent:
			if err != nil {
				return k.end(false), nil, false
			}
		case done, ok := <-k.done:
			if !ok {
				return k.end(false), nil, false
			}
			if done.Run == number {
				return k.finished(done), done.Value, true
			}
		case exited := <-k.child.process.waited:
			// Put back for end, which reads it again.
			k.child.process.waited <- exited
			return k.end(false), nil, false
		case <-timer.C:
			return k.end(true), nil, false
		case <-memory.exceeded:
			// Whatever the run holds goes: the kernel, and anything it started.
			killMembers(members())
			outcome := k.end(false)
			outcome.memoryExceeded, outcome.memoryLimit = true, bounds.memory
			return outcome, nil, false
		case <-cancelled:
			if !errors.Is(context.Cause(ctx), errCancelRequested) {
				return k.end(false), nil, false
			}
			cancelled = nil
			_ = syscall.Kill(k.child.process.pid, syscall.SIGINT)
			interrupted = time.After(interruptGrace)
		case <-interrupted:
			return k.end(false), nil, false
		}
	}
}

// finished is the outcome of a run the kernel answered; the processes the
// run left behind are killed, the kernel stays.
func (k *kernel) finished(done kernelDone) processOutcome {
	duration := time.Since(k.child.process.started)
	killOthers(k.child.process.pid, k.child.spec.reapAll)
	return processOutcome{exitCode: &done.ExitCode, duration: duration, peakMemoryBytes: peakMemory(k.child.process.pid)}
}

// end kills the kernel during a run and returns the run's outcome.
func (k *kernel) end(timedOut bool) processOutcome {
	outcome := k.kill()
	outcome.timedOut = timedOut
	return outcome
}

// kill kills the kernel and everything it started.
func (k *kernel) kill() processOutcome {
	var outcome processOutcome
	k.killOnce.Do(func() {
		close(k.gone)
		_ = k.conn.Close()
		outcome = k.child.abandon()
	})
	return outcome
}

// runPipes are one run's stdin, stdout and stderr: read and write ends.
type runPipes struct {
	stdin, stdout, stderr [2]*os.File
}

func newRunPipes() (*runPipes, error) {
	pipes, err := newPipes(3)
	if err != nil {
		return nil, fmt.Errorf("creating the run's pipes: %w", err)
	}
	return &runPipes{stdin: pipes[0], stdout: pipes[1], stderr: pipes[2]}, nil
}

// closeChildEnds closes the ends the kernel gets (none for nil).
func (p *runPipes) closeChildEnds() {
	if p == nil {
		return
	}
	closeAll(p.stdin[0], p.stdout[1], p.stderr[1])
}

// killOthers kills, except the runner and keep, every process the runner can
// signal (all) or those in keep's process group; a few passes catch the ones
// started while it looks. Zombies are left to the reaper.
func killOthers(keep int, all bool) {
	self := os.Getpid()
	for range 3 {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		killed := false
		for _, entry := range entries {
			pid, err := strconv.Atoi(entry.Name())
			if err != nil || pid == self || pid == keep || processGoneOrZombie(pid) {
				continue
			}
			if (all || processGroup(pid) == keep) && syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed = true
			}
		}
		if !killed {
			return
		}
	}
}

// processStat is the fields of /proc/PID/stat after the command name.
func processStat(pid int) []string {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
}

// processGoneOrZombie reports whether pid has exited (a zombie runs no code).
func processGoneOrZombie(pid int) bool {
	fields := processStat(pid)
	return len(fields) == 0 || fields[0] == "Z" || fields[0] == "X"
}

// processGroup is pid's process group, or -1.
func processGroup(pid int) int {
	fields := processStat(pid)
	if len(fields) < 3 {
		return -1
	}
	group, err := strconv.Atoi(fields[2])
	if err != nil {
		return -1
	}
	return group
}

// peakMemory is the peak resident size of the live process pid (VmHWM).
func peakMemory(pid int) *int64 {
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return nil
	}
	for line := range strings.Lines(string(status)) {
		if kilobytes, found := strings.CutPrefix(line, "VmHWM:"); found {
			value, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(kilobytes), " kB"), 10, 64)
			if err != nil {
				return nil
			}
			value *= 1024
			return &value
		}
	}
	return nil
}
