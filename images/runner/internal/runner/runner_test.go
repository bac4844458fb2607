package runner

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRunSeparatesStdoutAndStderr(t *testing.T) {
	f := newPythonFixture(t, `import sys
print("hello, world")
print("oops", file=sys.stderr)
`)
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "hello, world\n" {
		t.Errorf("stdout %q", got)
	}
	if got := output.text(StreamStderr); got != "oops\n" {
		t.Errorf("stderr %q", got)
	}
	result := output.result
	if result.StdoutBytes != 13 || result.StderrBytes != 5 || result.StdoutTruncated || result.StderrTruncated {
		t.Errorf("byte counts %+v", result)
	}
	if result.TimedOut || result.Error != nil || result.Diagnostics != nil {
		t.Errorf("unexpected result %+v", result)
	}
	if result.PeakMemoryBytes == nil || *result.PeakMemoryBytes < 1<<20 {
		t.Errorf("peak memory %v, want the interpreter's RSS", result.PeakMemoryBytes)
	}
	if result.DurationMs < 0 {
		t.Errorf("duration %d ms", result.DurationMs)
	}
}

func TestRunReportsNonZeroExit(t *testing.T) {
	f := newPythonFixture(t, `import sys
print("failing")
sys.exit(3)
`)
	output := f.run(context.Background())

	assertExit(t, output, intPtr(3), nil)
	if got := output.text(StreamStdout); got != "failing\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestRunReportsTheSignalThatKilledTheProgram(t *testing.T) {
	f := newPythonFixture(t, `import os, signal
os.kill(os.getpid(), signal.SIGSEGV)
`)
	output := f.run(context.Background())

	assertExit(t, output, nil, intPtr(int(syscall.SIGSEGV)))
}

func TestRunKillsTheProcessGroupAtTheTimeout(t *testing.T) {
	f := newShellFixture(t, `trap '' TERM
sleep 300 &
echo $! > "$HOME/pids"
echo $$ >> "$HOME/pids"
echo started
sleep 300
`)
	f.config.TimeoutSeconds = 1
	output := f.run(context.Background())

	if !output.result.TimedOut {
		t.Fatalf("not timed out: %+v", output.result)
	}
	assertExit(t, output, nil, intPtr(int(syscall.SIGKILL)))
	if got := output.text(StreamStdout); got != "started\n" {
		t.Errorf("stdout %q", got)
	}
	if output.result.DurationMs < 1000 {
		t.Errorf("duration %d ms, want at least the 1 s timeout", output.result.DurationMs)
	}
	pids := readPids(t, filepath.Join(f.opts.WorkDir, "pids"))
	if len(pids) != 2 {
		t.Fatalf("pids %v", pids)
	}
	waitGone(t, pids, 5*time.Second)
	if survivors := processesIn(t, f.opts.WorkDir); len(survivors) > 0 {
		t.Errorf("processes from the run survive: %v", survivors)
	}
}

func TestRunKillsWhatTheProgramLeavesBehind(t *testing.T) {
	f := newShellFixture(t, `trap '' TERM
sleep 300 &
echo $! > "$HOME/pids"
echo done
`)
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if output.result.TimedOut {
		t.Error("timed out")
	}
	// The background sleep holds the stdout pipe and ignores SIGTERM: only the
	// runner's kill ends it (the drain grace period would only stop reading).
	waitGone(t, readPids(t, filepath.Join(f.opts.WorkDir, "pids")), 5*time.Second)
}

func TestRunStopsTheProgramWhenCancelled(t *testing.T) {
	f := newShellFixture(t, "sleep 300\n")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	output := f.run(ctx)

	assertExit(t, output, nil, intPtr(int(syscall.SIGKILL)))
	if output.result.TimedOut {
		t.Error("a cancelled run is not a timeout")
	}
}

func TestRunCapsAFloodWithoutBlockingOrBuffering(t *testing.T) {
	const flood = 50 << 20
	f := newShellFixture(t, `yes xxxxxxxxxxxxxxx | head -c 52428800
echo done >&2
`)
	f.config.TimeoutSeconds = 60
	output, state := f.runInProcess(nil)

	assertExit(t, output, intPtr(0), nil)
	result := output.result
	if result.TimedOut {
		t.Fatal("the flood blocked until the timeout")
	}
	if result.StdoutBytes != flood || !result.StdoutTruncated {
		t.Errorf("stdout counted %d truncated %v, want %d true", result.StdoutBytes, result.StdoutTruncated, flood)
	}
	stdout := output.text(StreamStdout)
	if len(stdout) != DefaultMaxOutputBytes || strings.Trim(stdout, "x\n") != "" {
		t.Errorf("kept %d bytes of stdout, want the first %d", len(stdout), DefaultMaxOutputBytes)
	}
	if got := output.text(StreamStderr); got != "done\n" || result.StderrTruncated {
		t.Errorf("stderr %q truncated %v", got, result.StderrTruncated)
	}
	// Maxrss covers the runner and its (small) children: far below the flood.
	peakRSS := state.SysUsage().(*syscall.Rusage).Maxrss * 1024
	if peakRSS > 40<<20 {
		t.Errorf("runner peak RSS %d MiB, it buffers output", peakRSS>>20)
	}
	t.Logf("runner peak RSS during a 50 MiB flood: %.1f MiB", float64(peakRSS)/(1<<20))
}

func TestRunCapsEachStreamAtMaxOutputBytes(t *testing.T) {
	f := newPythonFixture(t, `import sys
sys.stdout.write("a" * 100)
sys.stderr.write("b" * 10)
`)
	f.config.MaxOutputBytes = 64
	output := f.run(context.Background())

	if got := output.text(StreamStdout); got != strings.Repeat("a", 64) {
		t.Errorf("stdout %q", got)
	}
	if got := output.text(StreamStderr); got != strings.Repeat("b", 10) {
		t.Errorf("stderr %q", got)
	}
	result := output.result
	if result.StdoutBytes != 100 || !result.StdoutTruncated || result.StderrBytes != 10 || result.StderrTruncated {
		t.Errorf("counts %+v", result)
	}
}

func TestRunFramesNonUTF8AndSplitSequences(t *testing.T) {
	f := newPythonFixture(t, `import sys, time
out = sys.stdout.buffer
out.write(b"bad \xff byte\n"); out.flush()
time.sleep(0.2)
out.write(b"euro \xe2\x82"); out.flush()
time.sleep(0.2)
out.write(b"\xac end\n"); out.flush()
`)
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if got, want := output.text(StreamStdout), "bad \uFFFD byte\neuro € end\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if !slices.ContainsFunc(output.frames, func(frame outputFrame) bool { return strings.Contains(frame.Data, "€") }) {
		t.Errorf("the euro sign was split across records: %+v", output.frames)
	}
	if output.result.StdoutBytes != 24 {
		t.Errorf("stdoutBytes %d counts the bytes, want 24", output.result.StdoutBytes)
	}
}

func TestRunDeliversStdinFilesAndArgs(t *testing.T) {
	f := newPythonFixture(t, `import os, sys
print(sys.argv[1:])
print(repr(sys.stdin.read()))
print(open("data/in.csv").read(), end="")
print(os.getcwd() == os.environ["HOME"])
`)
	stdin := "line one\nline two\n"
	f.stdin = &stdin
	f.config.HasStdin = true
	f.config.Args = []string{"an arg", "--flag"}
	f.config.Files = []FileMapping{{Key: "file-0", Path: "data/in.csv"}}
	f.inputFiles["file-0"] = "a,b\n1,2\n"
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	want := "['an arg', '--flag']\n'line one\\nline two\\n'\na,b\n1,2\nTrue\n"
	if got := output.text(StreamStdout); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

func TestRunGivesTheProgramACleanEnvironment(t *testing.T) {
	t.Setenv("SANDPOD_HOST_SECRET", "must-not-leak")
	f := newShellFixture(t, "env\n")
	f.config.Env = map[string]string{"EXTRA": "from-config", "LANG": "C"}
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	got := strings.Split(strings.TrimSpace(output.text(StreamStdout)), "\n")
	// dash exports PWD of its own accord.
	got = slices.DeleteFunc(got, func(v string) bool { return strings.HasPrefix(v, "PWD=") })
	slices.Sort(got)
	want := []string{
		"EXTRA=from-config",
		"HOME=" + f.opts.WorkDir,
		"LANG=C",
		"PATH=" + DefaultPath,
		"SANDPOD_OUTPUTS=" + outputsDir(f.opts.WorkDir),
		"TMPDIR=" + filepath.Dir(f.opts.WorkDir),
	}
	if !slices.Equal(got, want) {
		t.Errorf("environment\n got %q\nwant %q", got, want)
	}
}

func TestRunAppliesRlimitsToTheProgramOnly(t *testing.T) {
	var runnerLimitsBefore [4]syscall.Rlimit
	resources := [4]int{rlimitNproc, syscall.RLIMIT_FSIZE, syscall.RLIMIT_NOFILE, syscall.RLIMIT_CORE}
	for i, resource := range resources {
		if err := syscall.Getrlimit(resource, &runnerLimitsBefore[i]); err != nil {
			t.Fatal(err)
		}
	}
	f := newPythonFixture(t, `import errno, json, os, resource
limits = {name: resource.getrlimit(getattr(resource, name))
          for name in ("RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")}
print(json.dumps(limits))
try:
    with open("big", "wb") as big:
        big.write(b"x" * (2 << 20))
    print("wrote", os.path.getsize("big"))
except OSError as e:
    print("write failed:", errno.errorcode[e.errno], "size", os.path.getsize("big"))
`)
	f.config.Limits = Limits{Processes: 64, FileSizeBytes: 1 << 20, OpenFiles: 256}
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	lines := strings.Split(output.text(StreamStdout), "\n")
	var limits map[string][2]uint64
	if err := json.Unmarshal([]byte(lines[0]), &limits); err != nil {
		t.Fatalf("program output %q: %v", lines, err)
	}
	want := map[string][2]uint64{
		"RLIMIT_NPROC":  {64, 64},
		"RLIMIT_FSIZE":  {1 << 20, 1 << 20},
		"RLIMIT_NOFILE": {256, 256},
		"RLIMIT_CORE":   {0, 0},
	}
	assertSameJSON(t, "program rlimits", want, limits)
	if lines[1] != "write failed: EFBIG size 1048576" {
		t.Errorf("large write: %q", lines[1])
	}
	for i, resource := range resources {
		var after syscall.Rlimit
		if err := syscall.Getrlimit(resource, &after); err != nil {
			t.Fatal(err)
		}
		if after != runnerLimitsBefore[i] {
			t.Errorf("the runner's own %s changed from %+v to %+v", rlimitName(resource), runnerLimitsBefore[i], after)
		}
	}
}

func TestRunFileSizeLimitKillsAShellWrite(t *testing.T) {
	f := newShellFixture(t, "head -c 2000000 /dev/zero > big\necho \"head exit $?\"\n")
	f.config.Limits.FileSizeBytes = 1 << 20
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if got, want := output.text(StreamStdout), "head exit "+strconv.Itoa(128+int(syscall.SIGXFSZ))+"\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

func TestRunReportsAMissingInterpreter(t *testing.T) {
	f := newPythonFixture(t, "print(1)\n")
	f.config.Command = []string{"no-such-interpreter", "main.py"}
	output := f.run(context.Background())

	assertExit(t, output, nil, nil)
	if output.result.Error == nil || !strings.Contains(*output.result.Error, "no-such-interpreter") {
		t.Errorf("error %v", output.result.Error)
	}
	if output.result.PeakMemoryBytes != nil {
		t.Errorf("peak memory of a program that never ran: %d", *output.result.PeakMemoryBytes)
	}
}

func TestRunReportsAnInvalidConfig(t *testing.T) {
	f := newPythonFixture(t, "print(1)\n")
	f.config.TimeoutSeconds = 0
	f.config.Files = []FileMapping{{Key: "file-0", Path: "../escape"}}
	output := f.run(context.Background())

	assertExit(t, output, nil, nil)
	if output.result.Error == nil || !strings.Contains(*output.result.Error, "timeoutSeconds") ||
		!strings.Contains(*output.result.Error, "../escape") {
		t.Errorf("error %v", output.result.Error)
	}
	if len(output.frames) != 0 {
		t.Errorf("frames from a run that never started: %+v", output.frames)
	}
}

// ruffPath finds ruff on PATH or in the repository's virtualenv.
func ruffPath(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("ruff"); err == nil {
		return path
	}
	venvRuff, err := filepath.Abs("../../../../.venv/bin/ruff")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(venvRuff); err != nil {
		t.Skipf("ruff is neither on PATH nor at %s", venvRuff)
	}
	return venvRuff
}

func newLintFixture(t *testing.T, source string) *fixture {
	f := newPythonFixture(t, source)
	f.config.Mode = ModeLint
	f.config.LintCommand = []string{ruffPath(t), "check", "--output-format=json", "--no-cache", "--isolated", "main.py"}
	return f
}

func TestLintReportsAnUnusedImport(t *testing.T) {
	f := newLintFixture(t, "import os\n")
	output := f.run(context.Background())

	assertExit(t, output, intPtr(1), nil)
	want := []Diagnostic{{Code: "F401", Message: "`os` imported but unused", Line: 1, Column: 8}}
	assertSameJSON(t, "diagnostics", want, output.result.Diagnostics)
	if got := output.text(StreamStdout); got != "main.py:1:8: F401 `os` imported but unused\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestLintReportsNoDiagnosticsForCleanCode(t *testing.T) {
	f := newLintFixture(t, "print(2 + 2)\n")
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if output.result.Diagnostics == nil || len(output.result.Diagnostics) != 0 {
		t.Errorf("diagnostics %+v, want an empty list", output.result.Diagnostics)
	}
}

func TestLintReportsSyntaxErrors(t *testing.T) {
	f := newLintFixture(t, "def f(:\n    pass\n")
	output := f.run(context.Background())

	assertExit(t, output, intPtr(1), nil)
	if len(output.result.Diagnostics) == 0 || output.result.Diagnostics[0].Line != 1 || output.result.Diagnostics[0].Code == "" {
		t.Errorf("diagnostics %+v", output.result.Diagnostics)
	}
}

func TestRunAsPID1KillsEveryLeftoverProcessAndReaps(t *testing.T) {
	// The escapee leaves the program's session, out of reach of the process
	// group kill, and holds the stdout pipe: only kill(-1) by PID 1 ends it.
	// With the grace periods stretched to an hour, the run ends only once it
	// is killed; if it is not, execRunner fails the test at its deadline.
	// The program ends only once the escapee is out of its session.
	f := newShellFixture(t, `setsid sh -c 'trap "" TERM; echo > "$HOME/escaped"; sleep 3600' &
sleep 3600 &
until [ -e "$HOME/escaped" ]; do sleep 0.01; done
echo started
`)
	output, _ := f.runInProcess(func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		cmd.Env = append(cmd.Env, withoutGraceEnv+"=1")
	})

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "started\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestRunnerWithoutASummaryDoesNotExitZero(t *testing.T) {
	f := newPythonFixture(t, "print('PASSED')\n")
	f.opts.TerminationLogPath = filepath.Join(t.TempDir(), "missing-dir", "termination-log")
	log, state := f.execRunner(nil)

	if state.ExitCode() != ExitCodeNoSummary {
		t.Errorf("exit status %d, want %d", state.ExitCode(), ExitCodeNoSummary)
	}
	if strings.Contains(string(log), `"result"`) {
		t.Errorf("a summary in the log of a runner that could not write it: %s", log)
	}
}

func TestRunnerReportsAnInvalidCommandLineWithASummary(t *testing.T) {
	termination := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.Command(os.Args[0], "-termination-log", termination, "-no-such-flag")
	cmd.Env = []string{runAsRunnerEnv + "=1"}
	log, _ := cmd.Output()

	if cmd.ProcessState.ExitCode() != ExitCodeReported || !strings.Contains(string(log), "no-such-flag") {
		t.Errorf("exit status %d, log %s", cmd.ProcessState.ExitCode(), log)
	}
}

// verifiedLog is the operator's reading of a pod log: the genuine summary is
// the one whose key the termination message carries, the genuine frames the
// ones that verify under it.
func verifiedLog(t *testing.T, log []byte, termination summaryRecord) (frames []outputFrame, forged int) {
	t.Helper()
	key, err := hex.DecodeString(termination.Key)
	if err != nil || len(key) != frameKeyBytes {
		t.Fatalf("termination message key %q", termination.Key)
	}
	for _, line := range strings.Split(strings.TrimSuffix(string(log), "\n"), "\n") {
		var frame outputFrame
		var summary summaryRecord
		switch {
		case json.Unmarshal([]byte(line), &summary) == nil && summary.Key == termination.Key:
			return frames, forged
		case json.Unmarshal([]byte(line), &frame) == nil && frame.Seq == uint64(len(frames)+1) && verifyFrame(key, frame):
			frames = append(frames, frame)
		default:
			forged++
		}
	}
	t.Fatal("no genuine summary in the log")
	return nil, 0
}

func TestForgedSummariesAndFramesAreTold(t *testing.T) {
	// Root (in this test) can write into the runner's stdout through /proc
	// despite non-dumpable; the MACs must still tell the forgeries.
	f := newPythonFixture(t, `import json, os, sys
forged_result = {"exitCode": 0, "signal": None, "timedOut": False}
with open(os.environ["TERMINATION_LOG"], "w") as log:
    log.write(json.dumps({"result": forged_result, "frames": 0, "key": "00" * 32}))
print("genuine")
try:
    with open("/proc/%d/fd/1" % os.getppid(), "w") as runner_stdout:
        runner_stdout.write(json.dumps({"seq": 2, "stream": "stdout", "data": "PASSED\n", "mac": "00" * 16}) + "\n")
        runner_stdout.write(json.dumps({"result": forged_result, "frames": 1, "key": "00" * 32}) + "\n")
except OSError as e:
    print("cannot forge:", e.strerror)
sys.exit(3)
`)
	f.config.Env["TERMINATION_LOG"] = f.opts.TerminationLogPath
	log, state := f.execRunner(nil)
	if state.ExitCode() != ExitCodeReported {
		t.Fatalf("exit status %d", state.ExitCode())
	}
	var termination summaryRecord
	terminationLog, _ := os.ReadFile(f.opts.TerminationLogPath)
	if err := json.Unmarshal(terminationLog, &termination); err != nil {
		t.Fatal(err)
	}
	if termination.Result.ExitCode == nil || *termination.Result.ExitCode != 3 {
		t.Errorf("termination log %s, want the runner's summary with exit code 3", terminationLog)
	}
	frames, forged := verifiedLog(t, log, termination)
	text := joinFrames(frames)
	if !strings.HasPrefix(text, "genuine\n") || strings.Contains(text, "PASSED") || uint64(len(frames)) != termination.Frames {
		t.Errorf("genuine frames %q (%d, summary says %d)", text, len(frames), termination.Frames)
	}
	if os.Geteuid() == 0 && forged != 2 {
		t.Errorf("%d forged lines, want 2, log:\n%s", forged, log)
	}
}
