package runner

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// runCode runs source in the session as executionID; its answer must verify
// and its summary carry the session fields.
func (s *servingRunner) runCode(executionID, source string) runnerOutput {
	s.f.t.Helper()
	s.f.source = source
	answer := s.run(executionID)
	output := s.f.decodeLog(answer)
	summary := answer[bytes.LastIndexByte(answer[:len(answer)-1], '\n')+1:]
	if !bytes.Contains(summary, []byte(`"value":`)) || output.result.StateLost == nil || output.result.Kernel == nil {
		s.f.t.Fatalf("a session summary without value, stateLost or kernel: %s", summary)
	}
	return output
}

// value is the run's value: nil for null.
func (o runnerOutput) value() *string {
	if o.result.Value == nil {
		return nil
	}
	return o.result.Value.Text
}

func (o runnerOutput) stateLost() bool { return *o.result.StateLost }

func assertValue(t *testing.T, output runnerOutput, want *string) {
	t.Helper()
	assertSameJSON(t, "value", want, output.value())
}

func strPtr(v string) *string { return &v }

func assertRun(t *testing.T, output runnerOutput, exitCode int, stdout, stderr string, stateLost bool) {
	t.Helper()
	assertExit(t, output, intPtr(exitCode), nil)
	if output.text(StreamStdout) != stdout || output.text(StreamStderr) != stderr || output.stateLost() != stateLost {
		t.Errorf("stdout %q (want %q), stderr %q (want %q), stateLost %v (want %v)", output.text(StreamStdout), stdout,
			output.text(StreamStderr), stderr, output.stateLost(), stateLost)
	}
}

// assertQuietValue asserts a run that exited 0 with no output, its state kept, and the value want.
func assertQuietValue(t *testing.T, output runnerOutput, want *string) {
	t.Helper()
	assertRun(t, output, 0, "", "", false)
	assertValue(t, output, want)
}

func newPythonSession(t *testing.T) *servingRunner {
	return newPythonFixture(t, "").serve("--session")
}

func TestSessionRunsShareVariablesFunctionsImportsAndFiles(t *testing.T) {
	s := newPythonSession(t)
	first := s.runCode("exec-1", `import math
x = 41
def double(n):
    return 2 * n
with open("shared.txt", "w") as file:
    file.write("from run 1")
`)
	assertQuietValue(t, first, nil)
	second := s.runCode("exec-2", `print(x + 1, open("shared.txt").read(), math.pi > 3)
double(21)
`)
	assertRun(t, second, 0, "42 from run 1 True\n", "", false)
	assertValue(t, second, strPtr("42"))
}

func TestSessionReturnsTheTrailingExpressionsRepr(t *testing.T) {
	s := newPythonSession(t)
	for source, want := range map[string]*string{
		"y = 'a'\ny * 2":   strPtr("'aa'"),
		"print('p')":       nil,
		"None":             nil,
		"[1, {'k': (2,)}]": strPtr("[1, {'k': (2,)}]"),
		"z = 1":            nil,
		"if True:\n    3":  nil,
		"class C:\n  def __repr__(self): return 'C!'\nC()": strPtr("C!"),
	} {
		assertValue(t, s.runCode("exec-"+source, source), want)
	}
	long := s.runCode("exec-long", `"é" * 100000`)
	if value := *long.value(); len(value) > maxValueBytes || !strings.HasSuffix(value, "é…") || !strings.HasPrefix(value, "'éé") {
		t.Errorf("a long value is %d bytes ending %q", len(value), value[len(value)-8:])
	}
}

func TestSessionKeepsStateAfterAnExceptionASyntaxErrorAndSystemExit(t *testing.T) {
	s := newPythonSession(t)
	failed := s.runCode("exec-1", "x = 5\ndef f():\n    1 / 0\nf()\n")
	assertRun(t, failed, 1, "", `Traceback (most recent call last):
  File "<cell 1>", line 4, in <module>
  File "<cell 1>", line 3, in f
ZeroDivisionError: division by zero
`, false)
	syntax := s.runCode("exec-2", "print(\n")
	assertExit(t, syntax, intPtr(1), nil)
	if stderr := syntax.text(StreamStderr); !strings.HasPrefix(stderr, "  File \"<cell 2>\", line 1\n    print(\n") || strings.Contains(stderr, "Traceback") {
		t.Errorf("syntax error printed as %q", stderr)
	}
	assertRun(t, s.runCode("exec-3", "import sys\nx += 1\nsys.exit(3)"), 3, "", "", false)
	assertRun(t, s.runCode("exec-4", "raise SystemExit('bye')"), 1, "", "bye\n", false)
	third := s.runCode("exec-5", "f.__name__, x")
	assertQuietValue(t, third, strPtr("('f', 6)"))
}

func TestSessionTimeoutLosesTheStateAndTheNextRunWorks(t *testing.T) {
	f := newPythonFixture(t, "")
	s := f.serve("--session")
	assertRun(t, s.runCode("exec-1", "x = 1"), 0, "", "", false)
	f.config.TimeoutSeconds = 1
	timedOut := s.runCode("exec-2", "import time\nprint('started', flush=True)\ntime.sleep(30)")
	assertExit(t, timedOut, nil, intPtr(9))
	if !timedOut.result.TimedOut || !timedOut.stateLost() || timedOut.text(StreamStdout) != "started\n" {
		t.Errorf("timed out run: %+v, stdout %q", timedOut.summary, timedOut.text(StreamStdout))
	}
	f.config.TimeoutSeconds = 10
	next := s.runCode("exec-3", "print('ok')\n'x' in globals()")
	assertRun(t, next, 0, "ok\n", "", true)
	assertValue(t, next, strPtr("False"))
	assertRun(t, s.runCode("exec-4", "print('fine')"), 0, "fine\n", "", false)
}

func TestSessionKernelDeathLosesTheState(t *testing.T) {
	s := newPythonSession(t)
	assertRun(t, s.runCode("exec-1", "x = 1"), 0, "", "", false)
	died := s.runCode("exec-2", "import os\nprint('bye', flush=True)\nos._exit(7)")
	assertRun(t, died, 7, "bye\n", "", true)
	assertValue(t, s.runCode("exec-3", "'x' in globals()"), strPtr("False"))
	// A program that writes on the kernel's channel loses the kernel too.
	garbled := s.runCode("exec-4", "import os\nos.write(3, b'\\xff\\xff\\xff\\xff')\nimport time\ntime.sleep(5)")
	assertExit(t, garbled, nil, intPtr(9))
	if !garbled.stateLost() || garbled.result.TimedOut {
		t.Errorf("garbled channel: %+v", garbled.summary)
	}
	assertRun(t, s.runCode("exec-5", "print(1)"), 0, "1\n", "", true)
}

func TestSessionRefusesARunWhileBusyAndReplaysRecentRuns(t *testing.T) {
	s := newPythonSession(t)
	s.f.source = "import time\nprint('first', flush=True)\ntime.sleep(0.5)\nprint('second')"
	live := s.post(s.request("exec-1"), s.bearer())
	assertStatus(t, live, http.StatusOK)
	if line, err := bufio.NewReader(live.Body).ReadBytes('\n'); err != nil || !bytes.Contains(line, []byte(`"first\n"`)) {
		t.Fatalf("first streamed record %q (%v)", line, err)
	}
	assertStatus(t, s.post(s.request("exec-2"), s.bearer()), http.StatusConflict)
	first := s.run("exec-1")
	assertRun(t, s.f.decodeRecords(first), 0, "first\nsecond\n", "", false)

	keys := map[string]bool{s.f.decodeRecords(first).summary.Key: true}
	for run := 2; run <= keptRuns+1; run++ {
		keys[s.runCode("exec-"+strconv.Itoa(run), "print(1)").summary.Key] = true
	}
	if len(keys) != keptRuns+1 {
		t.Errorf("%d distinct frame keys over %d runs", len(keys), keptRuns+1)
	}
	previous := strconv.Itoa(keptRuns)
	replayed := s.f.decodeRecords(s.run("exec-" + previous))
	if replayed.summary.Key != s.f.decodeRecords(s.run("exec-"+previous)).summary.Key || replayed.text(StreamStdout) != "1\n" {
		t.Errorf("re-attach of the previous run: %+v", replayed.summary)
	}
	assertStatus(t, s.post(s.request("exec-1"), s.bearer()), http.StatusNotFound)
}

func TestSessionKeepsPackagesInstalledUnderHome(t *testing.T) {
	s := newPythonSession(t)
	installed := s.runCode("exec-1", `import os, site
package = os.path.join(site.getusersitepackages(), "sessionpkg")
os.makedirs(package)
open(os.path.join(package, "__init__.py"), "w").write("VALUE = 7\n")
os.environ["HOME"] == os.getcwd(), package.startswith(os.getcwd())
`)
	assertValue(t, installed, strPtr("(True, True)"))
	assertValue(t, s.runCode("exec-2", "import sessionpkg\nsessionpkg.VALUE"), strPtr("7"))
}

func TestSessionGivesEachRunItsStdinArgvAndFiles(t *testing.T) {
	f := newPythonFixture(t, "")
	s := f.serve("--session")
	stdin := "line\n"
	f.stdin = &stdin
	f.config.Args = []string{"a"}
	f.config.Files = []FileMapping{{Key: "file-0", Path: "data/in.csv"}}
	f.inputFiles["file-0"] = "v1"
	assertRun(t, s.runCode("exec-1", "import sys\nprint(input(), sys.argv, open('data/in.csv').read())"), 0, "line ['main.py', 'a'] v1\n", "", false)
	f.stdin, f.config.Args = nil, nil
	f.inputFiles["file-0"] = "v2"
	assertRun(t, s.runCode("exec-2", "print(repr(sys.stdin.read()), sys.argv, open('data/in.csv').read())"), 0, "'' ['main.py'] v2\n", "", false)
}

func TestSessionKillsWhatARunLeftBehindButNotTheKernel(t *testing.T) {
	s := newPythonSession(t)
	started := s.runCode("exec-1", `import os, subprocess, threading, time
child = subprocess.Popen(["sleep", "30"])
kernel = os.getpid()
child.pid`)
	pid, err := strconv.Atoi(*started.value())
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, []int{pid}, 2e9)
	assertValue(t, s.runCode("exec-2", "os.getpid() == kernel"), strPtr("True"))
}

func TestSessionKernelIsConfinedLikeAProgram(t *testing.T) {
	s := newPythonSession(t)
	output := s.runCode("exec-1", `import os, resource
try:
    os.kill(os.getppid(), 0)
except PermissionError:
    print("EPERM")
# Descriptors 10 and up may be inherited from the test's environment.
fds = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) < 10]
print(resource.getrlimit(resource.RLIMIT_NOFILE), sorted(os.environ), fds, os.readlink("/proc/self/fd/4"))
`)
	assertRun(t, output, 0, "EPERM\n(1024, 1024) ['HOME', 'LANG', 'PATH', 'PYTHONUNBUFFERED', 'SANDPOD_OUTPUTS', 'TMPDIR'] [0, 1, 2, 3, 4, 5] /dev/null\n", "", false)
}

func TestSessionRunsOtherCommandsFreshInTheSharedWorkDir(t *testing.T) {
	s := newShellFixture(t, "").serve("--session")
	assertRun(t, s.runCode("exec-1", `echo kept > f; X=1; echo "$HOME" "$PWD"`), 0, s.f.opts.WorkDir+" "+s.f.opts.WorkDir+"\n", "", false)
	second := s.runCode("exec-2", `cat f; echo "${X:-unset}"; exit 3`)
	assertRun(t, second, 3, "kept\nunset\n", "", false)
	assertValue(t, second, nil)
	if *second.result.Kernel {
		t.Error("a fresh process's run says it went through a kernel")
	}
}

// A session is one trust domain: a run can take over the kernel and answer
// for every later run. The runner cannot tell; the summary says whose word
// the result is (kernel: true), and the operator's record says so.
func TestSessionKernelAnswersForLaterRunsOnceARunTookItOver(t *testing.T) {
	s := newPythonSession(t)
	takeover := s.runCode("exec-1", `import sys
loop = sys._getframe(0).f_back.f_back
run = loop.f_locals["run"]
cells = dict(zip(run.__code__.co_freevars, run.__closure__))
cells["exec_"].cell_contents = lambda code, namespace: print("FORGED")
cells["eval_"].cell_contents = lambda code, namespace: None
`)
	assertRun(t, takeover, 0, "", "", false)
	forged := s.runCode("exec-2", "print('real'); sys.exit(7)")
	assertRun(t, forged, 0, "FORGED\n", "", false)
	if !*takeover.result.Kernel || !*forged.result.Kernel {
		t.Error("a run through the kernel does not say so")
	}
}

// outputNames are the paths of the files a run brought back.
func outputNames(output runnerOutput) []string {
	names := []string{}
	for _, file := range output.result.Outputs {
		names = append(names, file.Path)
	}
	return names
}

func TestSessionRunsEachStartWithAnEmptyOutputsDir(t *testing.T) {
	cases := []struct {
		session *servingRunner
		sources [3]string
	}{
		{newShellFixture(t, "").serve("--session"), [3]string{
			`echo a > "$SANDPOD_OUTPUTS/a.txt"`, `echo b > "$SANDPOD_OUTPUTS/b.txt"`, "true"}},
		{newPythonSession(t), [3]string{writeOutput("a.txt"), writeOutput("b.txt"), "pass"}},
	}
	for _, c := range cases {
		got := [][]string{}
		for i, source := range c.sources {
			got = append(got, outputNames(c.session.runCode("exec-"+strconv.Itoa(i), source)))
		}
		assertSameJSON(t, "outputs per run", [][]string{{"a.txt"}, {"b.txt"}, {}}, got)
	}
}

func writeOutput(name string) string {
	return `import os; open(os.path.join(os.environ["SANDPOD_OUTPUTS"], "` + name + `"), "w").write("x")`
}

func TestSessionStopsAtSIGTERMWithTheKernel(t *testing.T) {
	f := newPythonFixture(t, "")
	s := f.serve("--session")
	assertRun(t, s.runCode("exec-1", "print(1)"), 0, "1\n", "", false)
	s.terminate()
	if pids := processesIn(t, f.opts.WorkDir); len(pids) != 0 {
		t.Errorf("the kernel outlived the runner: %v", pids)
	}
}

func TestSessionNeedsServe(t *testing.T) {
	if _, err := ParseOptions([]string{"--session"}, io.Discard); err == nil {
		t.Error("--session without --serve was accepted")
	}
	opts, err := ParseOptions([]string{"--serve", "c.json", "--session"}, io.Discard)
	if err != nil || !opts.Session {
		t.Errorf("--serve c.json --session: %+v, %v", opts, err)
	}
}
