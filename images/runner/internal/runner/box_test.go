package runner

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// leaveEverything is a run that leaves what it can for the next: files in
// every writable place (TMPDIR is the scratch root: /tmp in a pod), a user-site module and shell rc files in its home, a
// unix socket, a held lock, a detached process.
const leaveEverything = `import fcntl, os, site, socket, subprocess
open("left.txt", "w").write("x")
open(os.environ["TMPDIR"] + "/stray", "w").write("x")
open("/dev/shm/shared", "w").write("x")
open(os.path.expanduser("~/.bashrc"), "w").write("echo poisoned\n")
os.makedirs(site.getusersitepackages(), exist_ok=True)
open(os.path.join(site.getusersitepackages(), "usercustomize.py"), "w").write("print('poisoned')\n")
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.environ["TMPDIR"] + "/listening.sock")
lock = open(os.environ["TMPDIR"] + "/held.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
subprocess.Popen(["python3", "-I", "-c", "import time; time.sleep(3600)", "sandpod-left-behind"], start_new_session=True)
print("left")
`

// findLeftovers prints what the next run can see of the one before.
const findLeftovers = `import os
seen = sorted(os.listdir(".")) + sorted(os.listdir(os.environ["TMPDIR"])) + sorted(os.listdir("/dev/shm"))
def cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""
sleepers = [p for p in os.listdir("/proc") if p.isdigit() and b"sandpod-left-behind" in cmdline(p)]
print(seen, sleepers)
`

func TestBoxedRunsSeeNothingOfTheRunsBefore(t *testing.T) {
	f := newPythonFixture(t, "")
	f.config.MaxRuns = 3
	s := f.serveAsPID1()

	s.f.source = leaveEverything
	first := f.decodeLog(s.run("exec-1"))
	assertExit(t, first, intPtr(0), nil)
	if got := first.text(StreamStdout); got != "left\n" || first.result.Retiring {
		t.Fatalf("first run: stdout %q stderr %q, %+v", got, first.text(StreamStderr), first.result)
	}
	s.f.source = findLeftovers
	second := f.decodeLog(s.run("exec-2"))
	assertExit(t, second, intPtr(0), nil)
	if got := second.text(StreamStdout); got != "['main.py', 'outputs', 'work'] []\n" || second.result.Retiring {
		t.Errorf("second run sees %q (stderr %q), %+v", got, second.text(StreamStderr), second.result)
	}
	s.f.source = "print('third')"
	third := f.decodeLog(s.run("exec-3"))
	if got := third.text(StreamStdout); got != "third\n" || !third.result.Retiring {
		t.Errorf("third run: %q, retiring %v", got, third.result.Retiring)
	}
	refused := s.post(s.request("exec-4"), s.bearer())
	assertStatus(t, refused, http.StatusGone)
}

func TestOneRunSandboxSaysItRetires(t *testing.T) {
	f := newPythonFixture(t, "print(1)")
	s := f.serve()
	only := f.decodeLog(s.run("exec-1"))
	if !only.result.Retiring || strings.TrimSpace(only.text(StreamStdout)) != "1" {
		t.Errorf("%+v", only.result)
	}
}

// harmNextBox stops one waiting interpreter of another box and kills the
// rest: the run after it must not notice.
const harmNextBox = `import os, signal, time
def find_waiting():
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and int(pid) != os.getpid() and b"_sandpod_released" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(int(pid))
        except OSError:
            pass
    return found
deadline = time.monotonic() + 10
while not (waiting := find_waiting()) and time.monotonic() < deadline:
    time.sleep(0.01)
for number, pid in enumerate(waiting):
    os.kill(pid, signal.SIGSTOP if number == 0 else signal.SIGKILL)
print(len(waiting) > 0)
`

func TestWhatARunDoesToTheNextBoxNeverReachesTheNextRun(t *testing.T) {
	for _, harm := range []string{harmNextBox, strings.Replace(harmNextBox, "number == 0", "number == -1", 1)} {
		f := newPythonFixture(t, "")
		f.config.MaxRuns = 3
		s := f.serveAsPID1()
		s.allowedStderr = "preparing the next run's box" // a killed box is replaced
		s.f.source = harm
		harmed := f.decodeLog(s.run("exec-1"))
		if got := harmed.text(StreamStdout); got != "True\n" {
			t.Fatalf("the harm found no waiting interpreter: %q %q", got, harmed.text(StreamStderr))
		}
		s.f.source = "print('fine')"
		next := f.decodeLog(s.run("exec-2"))
		assertExit(t, next, intPtr(0), nil)
		if got := next.text(StreamStdout); got != "fine\n" || next.result.Retiring {
			t.Errorf("the run after the harm: %q, %+v", got, next.result)
		}
		s.terminate()
	}
}

// A client that has read a run's summary posts the next run at once: it is
// never refused as busy.
func TestTheNextRunIsTakenAsSoonAsTheSummaryIsRead(t *testing.T) {
	f := newPythonFixture(t, "print(1)")
	f.config.MaxRuns = 20
	s := f.serve()
	for run := range 10 {
		response := s.post(s.request(fmt.Sprintf("exec-%d", run)), s.bearer())
		assertStatus(t, response, http.StatusOK)
		lines := bufio.NewReader(response.Body)
		for {
			line, err := lines.ReadBytes('\n')
			if err != nil {
				t.Fatalf("run %d: the answer ended before its summary: %v", run, err)
			}
			if bytes.Contains(line, []byte(`"key"`)) {
				break
			}
		}
	}
}
