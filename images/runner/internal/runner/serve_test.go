package runner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestServeRunsThePreStartedProgramAndAnswersWithVerifiedFrames(t *testing.T) {
	f := newPythonFixture(t, "import sys\nprint('hello')\nprint('oops', file=sys.stderr)\n")
	s := f.serve()
	body := s.run("exec-1")

	output := f.decodeLog(body)
	assertExit(t, output, intPtr(0), nil)
	if output.text(StreamStdout) != "hello\n" || output.text(StreamStderr) != "oops\n" {
		t.Errorf("output %q / %q", output.text(StreamStdout), output.text(StreamStderr))
	}
	want := append([]byte("{\"run\":{\"executionId\":\"exec-1\"}}\n"), body...)
	if log := s.podLog(); !bytes.Equal(log, want) {
		t.Errorf("the pod log after the credential line is not the run's start line and answer:\n%s\nvs\n%s", log, want)
	}
}

func TestServeRefusesAMissingOrWrongCredential(t *testing.T) {
	s := newPythonFixture(t, `print(1)`).serve()
	for _, authorization := range []string{"", "Bearer " + strings.Repeat("0", 64), s.credential, "Bearer " + s.credential + "0"} {
		response := s.post(s.request("exec-1"), authorization)
		assertStatus(t, response, http.StatusUnauthorized)
		if response.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("401 without WWW-Authenticate: Bearer")
		}
	}
	// Refused requests used nothing: the pod still serves its execution.
	s.f.decodeLog(s.run("exec-1"))
}

func TestServeRunsOneExecutionOnlyAndReplaysItToReattaches(t *testing.T) {
	f := newPythonFixture(t, `import sys, time
print("first", flush=True)
time.sleep(0.5)
print("second")
`)
	s := f.serve()
	live := s.post(s.request("exec-1"), s.bearer())
	assertStatus(t, live, http.StatusOK)
	firstLine, err := bufio.NewReader(live.Body).ReadBytes('\n')
	if err != nil || !bytes.Contains(firstLine, []byte(`"first\n"`)) {
		t.Fatalf("first streamed record %q (%v)", firstLine, err)
	}

	assertStatus(t, s.post(s.request("exec-2"), s.bearer()), http.StatusConflict)
	midRun := s.run("exec-1")
	afterRun := s.run("exec-1")
	if !bytes.Equal(midRun, afterRun) {
		t.Errorf("re-attaches differ:\n%s\nvs\n%s", midRun, afterRun)
	}
	output := f.decodeLog(afterRun)
	if output.text(StreamStdout) != "first\nsecond\n" {
		t.Errorf("stdout %q", output.text(StreamStdout))
	}
	assertStatus(t, s.post(s.request("exec-2"), s.bearer()), http.StatusGone)
}

func TestServeRejectsAConfigThePreStartedChildDoesNotFit(t *testing.T) {
	s := newPythonFixture(t, `print(1)`).serve()
	mismatched := s.request("exec-1")
	s.f.config.Env = map[string]string{"PYTHONUNBUFFERED": "0"}
	mismatched.Config = s.request("exec-1").Config
	assertStatus(t, s.post(mismatched, s.bearer()), http.StatusBadRequest)
	s.f.config.Env = map[string]string{"PYTHONUNBUFFERED": "1"}
	for _, body := range []string{`{"executionId": ""}`, `not json`} {
		response, err := http.Post(s.url+"/v1/run", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		assertStatus(t, response, http.StatusUnauthorized)
		request, _ := http.NewRequest(http.MethodPost, s.url+"/v1/run", strings.NewReader(body))
		request.Header.Set("Authorization", s.bearer())
		if response, err = http.DefaultClient.Do(request); err != nil {
			t.Fatal(err)
		}
		assertStatus(t, response, http.StatusBadRequest)
	}
	s.f.decodeLog(s.run("exec-1"))
}

func TestServeCountsTheTimeoutFromTheRelease(t *testing.T) {
	f := newPythonFixture(t, `import time
print("started", flush=True)
time.sleep(30)
`)
	f.config.TimeoutSeconds = 1
	s := f.serve()
	// Longer than the timeout between the pre-start and the release.
	time.Sleep(1500 * time.Millisecond)
	output := f.decodeLog(s.run("exec-1"))

	assertExit(t, output, nil, intPtr(9))
	if !output.result.TimedOut || output.text(StreamStdout) != "started\n" {
		t.Errorf("result %+v, stdout %q", output.result, output.text(StreamStdout))
	}
	if output.result.DurationMs < 1000 {
		t.Errorf("duration %d ms, want the 1 s timeout from the release", output.result.DurationMs)
	}
}

func TestServeFeedsStdinAndPlacesFiles(t *testing.T) {
	f := newPythonFixture(t, `import sys
print(sys.stdin.read().upper(), end="")
print(open("data/in.csv").read(), end="")
`)
	stdin := "from stdin\n"
	f.stdin = &stdin
	f.config.Files = []FileMapping{{Key: "file-0", Path: "data/in.csv"}}
	f.inputFiles["file-0"] = "a,b\n"
	output := f.decodeLog(f.serve().run("exec-1"))

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "FROM STDIN\na,b\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestServeRunsOtherCommandsThroughTheWaitingShim(t *testing.T) {
	f := newShellFixture(t, `echo "$0 $*"; echo "$HOME $PWD"; exit 4`)
	f.config.Args = []string{"a b", "c"}
	output := f.decodeLog(f.serve().run("exec-1"))

	assertExit(t, output, intPtr(4), nil)
	want := "main.sh a b c\n" + f.opts.WorkDir + " " + f.opts.WorkDir + "\n"
	if got := output.text(StreamStdout); got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
}

// The pre-started interpreter must be indistinguishable from `python3 main.py`
// as the one-off runner starts it.
func TestServePythonBehavesAsAFreshInterpreter(t *testing.T) {
	programs := map[string]string{
		"traceback": `def fail():
    raise ValueError("bad")

fail()
`,
		"chained": `try:
    1 / 0
except ZeroDivisionError as e:
    raise KeyError("k") from e
`,
		"system exit 3":       `import sys; print("bye"); sys.exit(3)`,
		"system exit message": `raise SystemExit("a message")`,
		"syntax error":        "print(\n",
		"main module": `import sys, __main__, pickle
print(__name__, __file__, sys.argv, sys.path[0], __main__.__file__, __spec__, __package__, __doc__)
print(type(__loader__).__name__, [m for m in ("_sandpod_run",) if m in globals()])
class C: pass
print(pickle.loads(pickle.dumps(C())).__class__.__module__)
`,
		"excepthook": `import sys
sys.excepthook = lambda *a: print("hooked", a[0].__name__)
raise OSError
`,
		"keyboard interrupt":  `raise KeyboardInterrupt`,
		"trailing expression": "x = 6\nprint('before')\nx * 7\n",
		"trailing error":      "x = 1\nx / 0\n",
		"docstring only":      `"a docstring"`,
		"printing repr": `class Loud:
    def __repr__(self):
        print("repr ran")
        raise ValueError("repr failed")
Loud()
`,
		"future import": "from __future__ import annotations\ndef f(x: Undefined) -> None: pass\nf.__annotations__\n",
		"limits and filter": `import os, resource
print(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_CORE))
try:
    os.kill(os.getppid(), 0)
except PermissionError:
    print("EPERM")
# The python bootstrap's value channel is one more descriptor, from 256 up.
print(sorted(os.environ), os.getcwd() == os.environ["HOME"], [fd for fd in os.listdir("/proc/self/fd") if int(fd) < 256], os.getpgid(0) == os.getpid())
`,
	}
	args := []string{"x", "-y"}
	for name, source := range programs {
		t.Run(name, func(t *testing.T) {
			// The interpreter itself, without the bootstrap (not [python3, main.py]).
			plain := newPythonFixture(t, source)
			plain.config.Command = []string{"env", "python3", "main.py"}
			plain.config.Args = args
			want := plain.run(context.Background())
			oneOff := newPythonFixture(t, source)
			oneOff.config.Args = args
			warm := newPythonFixture(t, source)
			warm.config.Args = args
			runs := map[string]*fixture{"one-off": oneOff, "serve": warm}
			outputs := map[string]runnerOutput{
				"one-off": oneOff.run(context.Background()),
				"serve":   warm.decodeLog(warm.serve().run("exec-1")),
			}
			for mode, got := range outputs {
				for _, stream := range []string{StreamStdout, StreamStderr} {
					wantText := strings.ReplaceAll(want.text(stream), plain.opts.WorkDir, "WORKDIR")
					gotText := strings.ReplaceAll(got.text(stream), runs[mode].opts.WorkDir, "WORKDIR")
					if gotText != wantText {
						t.Errorf("%s %s:\n got %q\nwant %q", mode, stream, gotText, wantText)
					}
				}
				assertExit(t, got, want.result.ExitCode, want.result.Signal)
			}
		})
	}
}

func TestPythonRunsReportTheirTrailingExpression(t *testing.T) {
	text := func(s string) *string { return &s }
	cases := []struct {
		name, source string
		want         *string
	}{
		{"an expression", "x = 6\nprint('out')\nx * 7\n", text("42")},
		{"a string", "'a' + 'b'", text("'ab'")},
		{"none", "print('no value')\nNone", nil},
		{"a statement", "x = 1", nil},
		{"an exception", "1 / 0", nil},
		{"an exit", "import sys\n40 + 2\nsys.exit(0)", nil},
		{"a failing repr", "class R:\n    def __repr__(self):\n        raise ValueError\nR()", nil},
		{"a closed channel", "import os\nos.closerange(3, 1024)\nf = open('x', 'w')\n7", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			oneOff := newPythonFixture(t, c.source)
			got := oneOff.run(context.Background())
			assertValue(t, got, c.want)
			warm := newPythonFixture(t, c.source)
			assertValue(t, warm.decodeLog(warm.serve().run("exec-1")), c.want)
		})
	}
}

func TestALongValueIsCut(t *testing.T) {
	got := newPythonFixture(t, "'é' * 70000").run(context.Background()).value()
	if got == nil {
		t.Fatal("no value")
	}
	if len(*got) > maxValueBytes || !strings.HasPrefix(*got, "'éé") || !strings.HasSuffix(*got, "é…") {
		t.Fatalf("value of %d bytes, want at most %d, cut with an ellipsis", len(*got), maxValueBytes)
	}
}

func TestOtherLanguagesReportNoValue(t *testing.T) {
	output := newShellFixture(t, "echo 42").run(context.Background())
	if output.result.Value != nil {
		t.Fatalf("a shell run reported a value: %v", *output.result.Value)
	}
}

func TestServeRefusesTheProgramThatCallsItsOwnRunner(t *testing.T) {
	f := newPythonFixture(t, `import sys, urllib.request, urllib.error
for header in ({}, {"Authorization": "Bearer " + "0" * 64}):
    request = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/run", data=b'{"executionId": "evil"}', headers=header)
    try:
        urllib.request.urlopen(request)
        print("accepted")
    except urllib.error.HTTPError as error:
        print(error.code)
`)
	s := f.serve()
	f.config.Args = []string{strconv.Itoa(s.port)}
	output := f.decodeLog(s.run("exec-1"))

	if got := output.text(StreamStdout); got != "401\n401\n" {
		t.Errorf("stdout %q, stderr %q", got, output.text(StreamStderr))
	}
}

func TestServeKillsTheRunAtSIGTERMAndReportsFirst(t *testing.T) {
	f := newPythonFixture(t, `import time
print("started", flush=True)
time.sleep(30)
`)
	s := f.serve()
	response := s.post(s.request("exec-1"), s.bearer())
	assertStatus(t, response, http.StatusOK)
	if _, err := bufio.NewReader(response.Body).ReadBytes('\n'); err != nil {
		t.Fatal(err)
	}
	_, records, _ := bytes.Cut(s.podLog(), []byte("\n"))
	output := f.decodeLog(records)

	assertExit(t, output, nil, intPtr(9))
	if output.result.TimedOut {
		t.Error("a SIGTERM is not a timeout")
	}
}

func TestServeStopsAtSIGTERMWithoutARun(t *testing.T) {
	f := newPythonFixture(t, `print(1)`)
	s := f.serve()
	if log := s.podLog(); len(log) != 0 {
		t.Errorf("pod log without a run: %q", log)
	}
	if pids := processesIn(t, f.opts.WorkDir); len(pids) != 0 {
		t.Errorf("the pre-started child outlived the runner: %v", pids)
	}
}

func TestServeLineIsJSON(t *testing.T) {
	line := marshalJSONLine(serveLine{serveEndpoint{Port: 7070, Credential: "ab"}})
	var decoded map[string]map[string]any
	if err := json.Unmarshal(line, &decoded); err != nil || string(line) != `{"serve":{"port":7070,"credential":"ab"}}`+"\n" {
		t.Errorf("credential line %q (%v)", line, err)
	}
}

// The waiting shim installs the filter before the release: the program it
// execs is as confined as in one-off mode.
func TestTheFilterGuardsTheServingRunner(t *testing.T) {
	f := newShellFixture(t, "")
	f.config.Command = []string{os.Args[0]}
	f.config.Env = map[string]string{probeEnv: "1"}
	assertProbesDenied(t, f.decodeLog(f.serve().run("exec-1")))
}
