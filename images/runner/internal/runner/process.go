package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"
)

// Variables, not constants, only so that tests can stretch them: a leftover
// process the runner failed to kill then shows as a run that does not end.
var (
	// drainGrace bounds how long output is still read once the program and
	// everything that could be killed are gone; a process the runner cannot
	// kill must not keep the result from being reported.
	drainGrace = 2 * time.Second
	// reapGrace bounds how long PID 1 waits for killed processes to be reaped.
	reapGrace = 5 * time.Second
)

const (
	readChunkBytes = 8 << 10
	coalesceWindow = 5 * time.Millisecond
)

// processSpec says how to start the program.
type processSpec struct {
	argv    []string
	env     []string
	dir     string
	stdin   *os.File
	limits  Limits
	timeout time.Duration
	// memoryLimit bounds the memory the run holds (memory.go); 0: none.
	memoryLimit uint64
	// box, when set, is the run's own view of the writable places (box.go):
	// dir is then its work dir as the runner sees it.
	box *box
	// selfExe is the runner binary, re-executed as the shim.
	selfExe string
	// guard is whom the program's seccomp filter protects: the runner.
	guard guardTarget
	// reapAll makes the runner reap every child and kill every process it can
	// signal once the program ends; only right when it is PID 1.
	reapAll bool
}

// processOutcome is what became of the program.
type processOutcome struct {
	exitCode *int
	signal   *int
	timedOut bool
	// memoryExceeded: the runner killed the run for holding more than its
	// memory limit.
	memoryExceeded  bool
	memoryLimit     uint64
	duration        time.Duration
	peakMemoryBytes *int64
	// startErr is set when the program could not be started at all.
	startErr error
}

type waitedChild struct {
	status   syscall.WaitStatus
	rusage   syscall.Rusage
	finished time.Time
}

// runProcess runs the program to its end, copying its output to stdout and
// stderr, and kills its process group at the timeout or when ctx is done.
func runProcess(ctx context.Context, spec processSpec, stdout, stderr io.Writer) processOutcome {
	child, err := startProcess(spec, shimArgv(spec.selfExe, spec.limits, spec.guard, shimRun, spec.box, spec.argv))
	if err != nil {
		return processOutcome{startErr: err}
	}
	return child.finish(ctx, spec, stdout, stderr)
}

// ownChildren holds the pids of the programs started and not yet reaped:
// whoever reaps orphans leaves them to their own reaper (reapChildren).
var ownChildren sync.Map

// startedProcess is the shim (and then the program) running, before anyone
// reads its output.
type startedProcess struct {
	pid       int
	pipes     *childPipes
	started   time.Time
	waited    chan waitedChild
	allReaped chan struct{}
}

// startProcess starts the shim with shimArgv; extraFiles become the
// descriptors between stderr and the shim's error pipe (see shimErrorFD).
func startProcess(spec processSpec, shimArgv []string, extraFiles ...*os.File) (*startedProcess, error) {
	pipes, err := newChildPipes()
	if err != nil {
		return nil, err
	}
	files := []uintptr{spec.stdin.Fd(), pipes.stdoutWrite.Fd(), pipes.stderrWrite.Fd()}
	for _, extra := range extraFiles {
		files = append(files, extra.Fd())
	}
	attr := &syscall.ProcAttr{
		Dir:   spec.dir,
		Env:   spec.env,
		Files: append(files, pipes.errorWrite.Fd()),
		// A new session is also a new process group, killed as a whole.
		Sys: &syscall.SysProcAttr{Setsid: true},
	}
	if spec.box != nil {
		// The shim enters the box and changes to its work dir there.
		attr.Dir = ""
		spec.box.namespaces(attr.Sys)
	}
	child := &startedProcess{pipes: pipes, started: time.Now(), waited: make(chan waitedChild, 1), allReaped: make(chan struct{})}
	child.pid, err = syscall.ForkExec(spec.selfExe, shimArgv, attr)
	if err == nil {
		ownChildren.Store(child.pid, true)
	}
	pipes.closeChildEnds()
	if err != nil {
		pipes.closeParentEnds()
		return nil, fmt.Errorf("starting the runner shim: %w", err)
	}
	go reapChildren(child.pid, spec.reapAll, child.waited, child.allReaped)
	return child, nil
}

// finish copies the program's output to stdout and stderr until it ends, kills
// its process group at the timeout (counted from now) or when ctx is done, and
// then everything it left behind.
func (p *startedProcess) finish(ctx context.Context, spec processSpec, stdout, stderr io.Writer) processOutcome {
	defer p.pipes.closeParentEnds()
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); drain(p.pipes.stdoutRead, stdout) }()
	go func() { defer readers.Done(); drain(p.pipes.stderrRead, stderr) }()

	shimError, _ := io.ReadAll(p.pipes.errorRead)

	timer := time.NewTimer(spec.timeout)
	defer timer.Stop()
	members := spec.members(p.pid)
	memory := watchMemory(spec.memoryLimit, members, spec.dir)
	defer memory.end()
	var outcome processOutcome
	var child waitedChild
	select {
	case child = <-p.waited:
	case <-timer.C:
		select {
		case child = <-p.waited:
		default:
			outcome.timedOut = true
			killProcessGroup(p.pid)
			child = <-p.waited
		}
	case <-memory.exceeded:
		select {
		case child = <-p.waited:
		default:
			outcome.memoryExceeded, outcome.memoryLimit = true, spec.memoryLimit
			// What holds the memory may have left the program's group.
			killMembers(members())
			killProcessGroup(p.pid)
			child = <-p.waited
		}
	case <-ctx.Done():
		killProcessGroup(p.pid)
		child = <-p.waited
	}

	// Whatever the program left behind in its group goes too, and as PID 1
	// every other process as well: nothing outlives the run.
	killProcessGroup(p.pid)
	if spec.box != nil {
		spec.box.killAll()
	}
	if spec.reapAll {
		_ = syscall.Kill(-1, syscall.SIGKILL)
		select {
		case <-p.allReaped:
		case <-time.After(reapGrace):
		}
	}
	waitOrClose(&readers, drainGrace, p.pipes.stdoutRead, p.pipes.stderrRead)

	outcome.duration = child.finished.Sub(p.started)
	if len(shimError) > 0 {
		outcome.startErr = errors.New(string(shimError))
		return outcome
	}
	switch {
	case child.status.Exited():
		code := child.status.ExitStatus()
		outcome.exitCode = &code
	case child.status.Signaled():
		signal := int(child.status.Signal())
		outcome.signal = &signal
	}
	peak := child.rusage.Maxrss * 1024
	outcome.peakMemoryBytes = &peak
	return outcome
}

// members lists the processes of the run of program pid: its box's, or
// runMembers'.
func (spec processSpec) members(pid int) func() []int {
	if spec.box != nil {
		return spec.box.members
	}
	return func() []int { return runMembers(pid, spec.reapAll) }
}

func killProcessGroup(pgid int) {
	// ESRCH only means the group is already gone.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// reapChildren waits for the program (pid) and sends its status on waited.
// With reapAll it reaps every child, the zombies reparented to PID 1
// included, until there are none left.
func reapChildren(pid int, reapAll bool, waited chan<- waitedChild, allReaped chan<- struct{}) {
	defer close(allReaped)
	waitFor := pid
	if reapAll {
		waitFor = -1
	}
	for {
		var status syscall.WaitStatus
		var rusage syscall.Rusage
		reaped, err := syscall.Wait4(waitFor, &status, 0, &rusage)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for. The program itself is always
			// reaped before that, so waited has been sent.
			return
		}
		if reaped == pid {
			ownChildren.Delete(pid)
			waited <- waitedChild{status: status, rusage: rusage, finished: time.Now()}
			if !reapAll {
				return
			}
		}
	}
}

// drain copies r to w until r ends or is closed. What the program writes within
// coalesceWindow of a first read goes out as one chunk: under gVisor every record
// the runner writes to the pod log crosses to the host, so a program printing
// 100,000 short lines would otherwise cost 100,000 records.
func drain(r *os.File, w io.Writer) {
	buf := make([]byte, readChunkBytes)
	for {
		n, err := r.Read(buf)
		if n > 0 && err == nil {
			n, err = fillWithin(r, buf, n, coalesceWindow)
		}
		if n > 0 {
			_, _ = w.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// fillWithin reads more into buf[n:] until buf is full or window has passed.
func fillWithin(r *os.File, buf []byte, n int, window time.Duration) (int, error) {
	if r.SetReadDeadline(time.Now().Add(window)) != nil {
		return n, nil
	}
	defer func() { _ = r.SetReadDeadline(time.Time{}) }()
	for n < len(buf) {
		read, err := r.Read(buf[n:])
		n += read
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// waitOrClose waits for the readers; past the grace period it closes their
// pipes, which ends their pending reads.
func waitOrClose(readers *sync.WaitGroup, grace time.Duration, pipes ...*os.File) {
	done := make(chan struct{})
	go func() {
		readers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	for _, pipe := range pipes {
		_ = pipe.Close()
	}
	<-done
}

// childPipes are the program's stdout and stderr and the shim's error channel.
type childPipes struct {
	stdoutRead, stdoutWrite *os.File
	stderrRead, stderrWrite *os.File
	errorRead, errorWrite   *os.File
}

func newChildPipes() (*childPipes, error) {
	pipes, err := newPipes(3)
	if err != nil {
		return nil, fmt.Errorf("creating the program's pipes: %w", err)
	}
	return &childPipes{
		stdoutRead: pipes[0][0], stdoutWrite: pipes[0][1],
		stderrRead: pipes[1][0], stderrWrite: pipes[1][1],
		errorRead: pipes[2][0], errorWrite: pipes[2][1],
	}, nil
}

// newPipes creates count pipes, each as its read and write end, or none.
func newPipes(count int) ([][2]*os.File, error) {
	pipes := make([][2]*os.File, 0, count)
	for range count {
		read, write, err := os.Pipe()
		if err != nil {
			for _, pipe := range pipes {
				closeAll(pipe[:]...)
			}
			return nil, err
		}
		pipes = append(pipes, [2]*os.File{read, write})
	}
	return pipes, nil
}

func (p *childPipes) closeChildEnds() {
	closeAll(p.stdoutWrite, p.stderrWrite, p.errorWrite)
}

func (p *childPipes) closeParentEnds() {
	closeAll(p.stdoutRead, p.stderrRead, p.errorRead)
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		if f != nil {
			_ = f.Close()
		}
	}
}
