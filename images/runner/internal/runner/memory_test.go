package runner

import (
	"context"
	"syscall"
	"testing"
)

// A program that keeps allocating is killed once it holds more than its
// memory limit, and its result says so (not a timeout, not a plain signal).
func TestRunKillsAProgramPastItsMemoryLimit(t *testing.T) {
	f := newPythonFixture(t, `print("start", flush=True)
chunks = []
while True:
    chunks.append(bytearray(8 << 20))
`)
	f.config.MemoryLimitBytes = 96 << 20
	f.config.TimeoutSeconds = 30
	output := f.run(context.Background())

	if !output.result.MemoryExceeded || output.result.TimedOut {
		t.Fatalf("memoryExceeded %v, timedOut %v: %+v", output.result.MemoryExceeded, output.result.TimedOut, output.result)
	}
	assertExit(t, output, nil, intPtr(int(syscall.SIGKILL)))
	if limit := output.result.MemoryLimitBytes; limit == nil || *limit != 96<<20 {
		t.Errorf("memoryLimitBytes %v, want %d", limit, 96<<20)
	}
	if output.result.DurationMs > 5000 {
		t.Errorf("killed after %d ms", output.result.DurationMs)
	}
	if got := output.text(StreamStdout); got != "start\n" {
		t.Errorf("stdout %q", got)
	}
}

// Memory held by a child the program started counts too.
func TestRunCountsTheMemoryOfTheProgramsChildren(t *testing.T) {
	f := newShellFixture(t, `python3 -c 'b = bytearray(128 << 20); import time; time.sleep(30)'
echo "the child ended"
`)
	f.config.MemoryLimitBytes = 64 << 20
	f.config.TimeoutSeconds = 30
	output := f.run(context.Background())

	if !output.result.MemoryExceeded {
		t.Fatalf("not memoryExceeded: %+v", output.result)
	}
}

// A program within its limit runs to its end, and the result says nothing of
// memory.
func TestRunWithinItsMemoryLimitEndsAsUsual(t *testing.T) {
	f := newPythonFixture(t, `b = bytearray(16 << 20)
print(len(b))
`)
	f.config.MemoryLimitBytes = 256 << 20
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if output.result.MemoryExceeded || output.result.MemoryLimitBytes != nil {
		t.Errorf("memory reported: %+v", output.result)
	}
}

// In a session a run past its memory loses the interpreter, not the session:
// the next run is served by a fresh one.
func TestSessionRunPastItsMemoryLimitLosesTheStateOnly(t *testing.T) {
	f := newPythonFixture(t, "")
	s := f.serve("--session")
	assertRun(t, s.runCode("exec-1", "x = 1"), 0, "", "", false)
	f.config.MemoryLimitBytes = 96 << 20
	hog := s.runCode("exec-2", "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))")
	assertExit(t, hog, nil, intPtr(int(syscall.SIGKILL)))
	if !hog.result.MemoryExceeded || !hog.stateLost() || hog.result.TimedOut {
		t.Fatalf("hog: %+v", hog.summary)
	}
	next := s.runCode("exec-3", "print('ok')\n'x' in globals()")
	assertRun(t, next, 0, "ok\n", "", true)
	assertValue(t, next, strPtr("False"))
}

// A serving sandbox's run gets the memory limit of its own request.
func TestServedRunPastItsMemoryLimitIsKilled(t *testing.T) {
	f := newPythonFixture(t, "")
	s := f.serve()
	f.config.MemoryLimitBytes = 96 << 20
	s.f.source = "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20))"
	hog := f.decodeLog(s.run("exec-1"))
	assertExit(t, hog, nil, intPtr(int(syscall.SIGKILL)))
	if !hog.result.MemoryExceeded {
		t.Fatalf("hog: %+v", hog.summary)
	}
}
