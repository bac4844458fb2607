package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// cancel posts POST /v1/cancel for executionID and returns the status.
func (s *servingRunner) cancel(executionID string) int {
	s.f.t.Helper()
	body, err := json.Marshal(cancelRequest{ExecutionID: executionID})
	if err != nil {
		s.f.t.Fatal(err)
	}
	request, err := http.NewRequest(http.MethodPost, s.url+"/v1/cancel", bytes.NewReader(body))
	if err != nil {
		s.f.t.Fatal(err)
	}
	request.Header.Set("Authorization", s.bearer())
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		s.f.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, response.Body)
	_ = response.Body.Close()
	return response.StatusCode
}

// startAndCancel starts source as executionID, waits for its first line of
// output, cancels it and returns the decoded answer.
func (s *servingRunner) startAndCancel(executionID, source string) runnerOutput {
	s.f.t.Helper()
	s.f.source = source
	live := s.post(s.request(executionID), s.bearer())
	assertStatus(s.f.t.(*testing.T), live, http.StatusOK)
	reader := bufio.NewReader(live.Body)
	first, err := reader.ReadBytes('\n')
	if err != nil {
		s.f.t.Fatalf("first record: %v", err)
	}
	if status := s.cancel(executionID); status != http.StatusAccepted {
		s.f.t.Fatalf("cancel: status %d, want 202", status)
	}
	rest, err := io.ReadAll(reader)
	if err != nil {
		s.f.t.Fatal(err)
	}
	return s.f.decodeRecords(append(first, rest...))
}

func TestSessionCancelInterruptsThePythonRunAndKeepsTheState(t *testing.T) {
	s := newPythonSession(t)
	assertRun(t, s.runCode("exec-1", "x = 41"), 0, "", "", false)
	cancelled := s.startAndCancel("exec-2", "import time\nprint('started', flush=True)\nx += 1\ntime.sleep(30)")
	assertExit(t, cancelled, intPtr(1), nil)
	if !cancelled.result.Cancelled || *cancelled.result.StateLost || cancelled.result.TimedOut ||
		!strings.Contains(cancelled.text(StreamStderr), "KeyboardInterrupt") {
		t.Errorf("cancelled run: %+v, stderr %q", cancelled.summary, cancelled.text(StreamStderr))
	}
	next := s.runCode("exec-3", "x")
	assertQuietValue(t, next, strPtr("42"))
	if next.result.Cancelled {
		t.Error("the run after a cancelled one says it was cancelled")
	}
	if status := s.cancel("exec-3"); status != http.StatusConflict {
		t.Errorf("cancel of an ended run: status %d, want 409", status)
	}
}

func TestSessionCancelKillsAKernelThatIgnoresTheInterrupt(t *testing.T) {
	s := newPythonSession(t)
	cancelled := s.startAndCancel("exec-1", `import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print('started', flush=True)
time.sleep(30)`)
	assertExit(t, cancelled, nil, intPtr(9))
	if !cancelled.result.Cancelled || !*cancelled.result.StateLost || cancelled.result.TimedOut {
		t.Errorf("cancelled run: %+v", cancelled.summary)
	}
	assertRun(t, s.runCode("exec-2", "print('fresh')"), 0, "fresh\n", "", true)
}

func TestSessionCancelKillsAFreshProcessRun(t *testing.T) {
	s := newShellFixture(t, "").serve("--session")
	cancelled := s.startAndCancel("exec-1", "echo started; sleep 30")
	assertExit(t, cancelled, nil, intPtr(9))
	if !cancelled.result.Cancelled || cancelled.result.TimedOut {
		t.Errorf("cancelled run: %+v", cancelled.summary)
	}
	assertRun(t, s.runCode("exec-2", "echo next"), 0, "next\n", "", false)
}

func TestCancelOfAnUnknownRunIsAConflict(t *testing.T) {
	s := newPythonSession(t)
	if status := s.cancel("never-ran"); status != http.StatusConflict {
		t.Errorf("status %d, want 409", status)
	}
}
