package runner

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// releaseReady is the byte the pre-started child writes on the release socket
// once it waits for its program.
const releaseReady = 'R'

// pythonCommand matches the interpreters the python bootstrap serves.
var pythonCommand = regexp.MustCompile(`^python(3(\.[0-9]+)?)?$`)

// pythonBootstrap runs as `python3 -c` for every python program the runner
// starts from [python…, sourceFile] (one-off and serve mode; sessions have
// their kernel). Its argv is sys.argv after `-c` (one-off), or else it says
// it is ready on fd 3, the release socket, and reads it there, NUL-separated
// (serve mode). It runs argv[0] as __main__ the way `python3 main.py` does:
// the same sys.argv, sys.path[0], __file__ and __loader__, tracebacks without
// the bootstrap's frame, exit status 1 after an uncaught exception,
// SystemExit and KeyboardInterrupt handled by the interpreter as usual. When
// the source ends with an expression, its value's repr (cut to 65,537
// characters, computed with sys.stdout and sys.stderr sent to /dev/null, so
// a __repr__ prints nothing and its exception is no error) goes out on fd 3,
// moved up out of the program's way, and the write end is then closed.
const pythonBootstrap = `import os, sys
from _ast import Expr, Expression, PyCF_ONLY_AST
from fcntl import F_DUPFD_CLOEXEC, fcntl
from importlib.machinery import SourceFileLoader


def _sandpod_released():
    os.write(3, b"R")
    chunks = []
    while chunk := os.read(3, 65536):
        chunks.append(chunk)
    return [os.fsdecode(arg) for arg in b"".join(chunks).split(b"\0")]


def _sandpod_report(channel, identity, value):
    streams = sys.stdout, sys.stderr
    try:
        # The program may have closed the channel and opened a file of its own there.
        if os.fstat(channel)[1:3] != identity:
            return
        with open(os.devnull, "w") as null:
            sys.stdout = sys.stderr = null
            text = memoryview(repr(value)[:65537].encode(errors="replace"))
    except BaseException:
        return
    finally:
        sys.stdout, sys.stderr = streams
    try:
        while text:
            text = text[os.write(channel, text):]
    except OSError:
        pass


def _sandpod_run():
    argv = sys.argv[1:] or _sandpod_released()
    try:
        channel = fcntl(3, F_DUPFD_CLOEXEC, 256)
    except OSError:
        channel = os.dup(3)
    os.close(3)
    identity = os.fstat(channel)[1:3]
    script = os.path.abspath(argv[0])
    sys.argv = argv
    sys.orig_argv = sys.orig_argv[:1] + argv
    sys.path[0] = os.path.dirname(script)
    try:
        with open(script, "rb") as file:
            source = file.read()
    except OSError as error:
        sys.stderr.write(f"{sys.orig_argv[0]}: can't open file {script!r}: [Errno {error.errno}] {error.strerror}\n")
        sys.exit(2)
    main = type(sys)("__main__")
    main.__file__, main.__cached__ = script, None
    main.__loader__ = SourceFileLoader("__main__", script)
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    try:
        tree = compile(source, script, "exec", PyCF_ONLY_AST, dont_inherit=True)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], Expr) else None
        body = compile(tree, script, "exec", dont_inherit=True)
        trailing = None if last is None else compile(Expression(last.value), script, "eval", dont_inherit=True)
        exec(body, main.__dict__)
        value = None if trailing is None else eval(trailing, main.__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        # The first entry is this frame; the program's start below it.
        traceback = error.__traceback__.tb_next
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        if isinstance(error, KeyboardInterrupt):
            import signal
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)
    if value is not None:
        _sandpod_report(channel, identity, value)
    try:
        os.close(channel)
    except OSError:
        pass


_sandpod_run()
`

// warmChild is the program's process started before any request: the shim
// with its limits and filter in place, or the python interpreter running the
// bootstrap, blocked on the release socket.
type warmChild struct {
	process *startedProcess
	spec    processSpec
	python  bool
	release *os.File
	stdin   *os.File
	// released is set once the child was given its program.
	released bool
}

// usesPythonBootstrap reports whether cfg runs its source with a python
// interpreter the bootstrap can stand in for: exactly [python…, sourceFile].
func usesPythonBootstrap(cfg Config) bool {
	return len(cfg.Command) == 2 && cfg.Command[1] == cfg.SourceFile &&
		pythonCommand.MatchString(filepath.Base(cfg.Command[0]))
}

// prestart starts the program's process for cfg in the work dir and waits
// until it is ready to be released.
func prestart(cfg Config, opts Options, inBox *box) (*warmChild, error) {
	var interpreter []string
	if usesPythonBootstrap(cfg) {
		interpreter = []string{cfg.Command[0], "-c", pythonBootstrap}
	}
	child, err := startWaiting(cfg, opts, inBox, interpreter)
	if err == nil {
		child.python = interpreter != nil
	}
	return child, err
}

// startWaiting starts the waiting shim for cfg in the work dir (in inBox when
// set: opts.WorkDir is then the box's work dir as the runner sees it), which
// execs argv (an interpreter that waits on the release socket itself) or else
// waits there, and returns once the child said it is ready.
func startWaiting(cfg Config, opts Options, inBox *box, argv []string) (*warmChild, error) {
	if err := createWorkDir(opts.WorkDir); err != nil {
		return nil, err
	}
	sockets, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating the release socket: %w", err)
	}
	// The runner's end goes through the poller, so closing it ends a pending read.
	if err := syscall.SetNonblock(sockets[0], true); err != nil {
		closeAll(os.NewFile(uintptr(sockets[0]), "release"), os.NewFile(uintptr(sockets[1]), "release-child"))
		return nil, fmt.Errorf("creating the release socket: %w", err)
	}
	release, childRelease := os.NewFile(uintptr(sockets[0]), "release"), os.NewFile(uintptr(sockets[1]), "release-child")
	stdinRead, stdinWrite, err := os.Pipe()
	if err != nil {
		_ = release.Close()
		return nil, fmt.Errorf("creating the stdin pipe: %w", err)
	}
	defer stdinRead.Close()

	child := &warmChild{spec: newProcessSpec(cfg, opts, stdinRead), release: release, stdin: stdinWrite}
	if inBox != nil {
		child.spec.box = inBox
		child.spec.env = programEnv(cfg.Env, inBox.workDir)
		// Not every process: another box may be alive (boxedRuns reaps the orphans).
		child.spec.reapAll = false
	}
	shim := shimArgv(selfExePath, cfg.Limits, child.spec.guard, shimWait, child.spec.box, argv)
	child.process, err = startProcess(child.spec, shim, childRelease)
	// Only the child holds its end now: a child that dies before it is ready
	// ends the read below.
	_ = childRelease.Close()
	if err != nil {
		closeAll(release, stdinWrite)
		return nil, err
	}
	if err := awaitReady(release, child.process.pid); err != nil {
		outcome := child.abandon()
		if outcome.startErr != nil {
			return nil, fmt.Errorf("the program could not be pre-started: %w", outcome.startErr)
		}
		return nil, fmt.Errorf("the pre-started program ended before its release (exit code %s, signal %s)",
			describe(outcome.exitCode), describe(outcome.signal))
	}
	if inBox != nil {
		if inBox.userNamespace, err = os.Readlink(fmt.Sprintf("/proc/%d/ns/user", child.process.pid)); err != nil {
			child.abandon()
			return nil, fmt.Errorf("reading the box's user namespace: %w", err)
		}
	}
	return child, nil
}

// readyWait bounds how long a child may take to say it is ready; readyNudge
// is how often it is continued meanwhile (a run of the sandbox may have
// stopped the next box's program, which runs as the same user).
const (
	readyWait  = 60 * time.Second
	readyNudge = 100 * time.Millisecond
)

// awaitReady reads the child's ready byte from the release socket.
func awaitReady(release *os.File, pid int) error {
	deadline := time.Now().Add(readyWait)
	ready := make([]byte, 1)
	for {
		_ = release.SetReadDeadline(time.Now().Add(readyNudge))
		_, err := release.Read(ready)
		switch {
		case err == nil && ready[0] == releaseReady:
			return release.SetReadDeadline(time.Time{})
		case err == nil:
			return fmt.Errorf("the child said %q, not that it is ready", ready[0])
		case !errors.Is(err, os.ErrDeadlineExceeded) || time.Now().After(deadline):
			return err
		}
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// run writes the request's files, releases the child with cfg's argv and
// stdin, and runs it to its end; the timeout counts from the release.
func (c *warmChild) run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	c.released = true
	if err := writeRequestFiles(c.spec.dir, withSource(cfg, request), false); err != nil {
		c.abandon()
		return failedResult(err)
	}
	argv := append(slices.Clone(cfg.Command), cfg.Args...)
	if c.python {
		argv = argv[1:]
	}
	c.spec.timeout = time.Duration(cfg.TimeoutSeconds) * time.Second
	c.spec.memoryLimit = uint64(cfg.MemoryLimitBytes)
	var reported *valueReader
	result := runCaptured(cfg, frames, outputsDir(c.spec.dir), func(stdout, stderr io.Writer) processOutcome {
		c.process.started = time.Now()
		go feedStdin(c.stdin, request.Stdin)
		reported = c.releaseWith(argv)
		return c.process.finish(ctx, c.spec, stdout, stderr)
	})
	if reported != nil {
		result.setValue(reported.value())
	}
	return result
}

// releaseWith gives the child its argv. The python bootstrap reports its
// value on the same socket: the runner then only ends its writing, and reads.
func (c *warmChild) releaseWith(argv []string) *valueReader {
	// A child that died already shows in its outcome.
	_, _ = io.WriteString(c.release, strings.Join(argv, "\x00"))
	if c.python && shutdownWrite(c.release) == nil {
		return readValue(c.release)
	}
	_ = c.release.Close()
	return nil
}

// alive continues the child (in case something stopped it) and says whether
// it still waits for its release.
func (c *warmChild) alive() bool {
	if syscall.Kill(c.process.pid, syscall.SIGCONT) != nil {
		return false
	}
	select {
	case exited := <-c.process.waited:
		c.process.waited <- exited // for finish, which reads it
		return false
	default:
		return true
	}
}

// close kills the child if it was never released.
func (c *warmChild) close() {
	if !c.released {
		c.abandon()
	}
}

// abandon kills the child that will not run, and everything it started.
func (c *warmChild) abandon() processOutcome {
	closeAll(c.release, c.stdin)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	return c.process.finish(cancelled, c.spec, io.Discard, io.Discard)
}

func feedStdin(stdin *os.File, content *string) {
	if content != nil {
		// A program that exits without reading all of it ends the write (EPIPE).
		_, _ = io.WriteString(stdin, *content)
	}
	_ = stdin.Close()
}

// withSource is the request's files with its source as cfg's source file first.
func withSource(cfg Config, request runRequest) []inlineFile {
	return append([]inlineFile{{Path: cfg.SourceFile, Content: request.Source}}, request.Files...)
}

// writeRequestFiles places files in the work dir. With replace (session
// mode) a file left there by an earlier run is replaced; without, it is an
// error, as is a path given twice.
func writeRequestFiles(workDir string, files []inlineFile, replace bool) error {
	seen := make(map[string]bool, len(files))
	for _, file := range files {
		if !filepath.IsLocal(file.Path) {
			return fmt.Errorf("file path %q is not a relative path inside the work dir", file.Path)
		}
		path := filepath.Join(workDir, file.Path)
		if seen[path] {
			return fmt.Errorf("file path %q is given twice", file.Path)
		}
		seen[path] = true
		if replace {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("replacing %s: %w", path, err)
			}
		}
		content, err := file.bytes()
		if err != nil {
			return err
		}
		if err := writeWorkFile(path, bytes.NewReader(content), file.Path); err != nil {
			return err
		}
	}
	return nil
}

// checkServable says why request cannot run in a child pre-started for
// served: the fields the child was started with must be the same.
func checkServable(served, request Config) error {
	switch {
	case request.Mode != ModeRun:
		return fmt.Errorf("serve mode runs programs only, not mode %q", request.Mode)
	case !slices.Equal(served.Command, request.Command):
		return fmt.Errorf("the command %q is not the pre-started %q", request.Command, served.Command)
	case !maps.Equal(served.Env, request.Env):
		return fmt.Errorf("the env is not the pre-started program's")
	case served.Limits != request.Limits:
		return fmt.Errorf("the limits %+v are not the pre-started %+v", request.Limits, served.Limits)
	case served.SourceFile != request.SourceFile:
		return fmt.Errorf("the sourceFile %q is not the pre-started %q", request.SourceFile, served.SourceFile)
	case !slices.Equal(served.CompileCommand, request.CompileCommand):
		return fmt.Errorf("the compileCommand %q is not the served %q", request.CompileCommand, served.CompileCommand)
	}
	return nil
}

func describe(value *int) string {
	if value == nil {
		return "none"
	}
	return strconv.Itoa(*value)
}

// bytes is the file's content: its text, or what its base64 encodes.
func (f inlineFile) bytes() ([]byte, error) {
	if f.Encoding == "" {
		return []byte(f.Content), nil
	}
	if f.Encoding != "base64" {
		return nil, fmt.Errorf("file %q: unknown encoding %q", f.Path, f.Encoding)
	}
	content, err := base64.StdEncoding.DecodeString(f.Content)
	if err != nil {
		return nil, fmt.Errorf("file %q: invalid base64: %w", f.Path, err)
	}
	return content, nil
}
