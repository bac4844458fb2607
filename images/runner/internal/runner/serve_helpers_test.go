package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// servingRunner is the runner in serve mode, as its own process, serving the
// fixture's config.
type servingRunner struct {
	f   *fixture
	cmd *exec.Cmd
	// wrapped: cmd runs the runner through a wrapper (serveAsPID1).
	wrapped    bool
	url        string
	port       int
	credential string
	// log is the runner's stdout after the credential line.
	mu  sync.Mutex
	log bytes.Buffer
	// logDone is closed when the runner's stdout ends.
	logDone chan struct{}
	stderr  bytes.Buffer
	// allowedStderr: a line of stderr with it is expected, no failure.
	allowedStderr string
}

// serve starts the runner in serve mode with the fixture's config as the
// serve config and waits until it answers GET /ready; flags are added.
func (f *fixture) serve(flags ...string) *servingRunner {
	f.t.Helper()
	return f.serveAs(nil, flags...)
}

// serveAsPID1 starts the serving runner as PID 1 of a new PID namespace with
// its own /proc, as in a pod.
func (f *fixture) serveAsPID1(flags ...string) *servingRunner {
	f.t.Helper()
	return f.serveAs([]string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM"}, flags...)
}

// serveAs starts the serving runner, through the command wrapper when given.
func (f *fixture) serveAs(wrapper []string, flags ...string) *servingRunner {
	f.t.Helper()
	f.writeInputs()
	s := &servingRunner{f: f, logDone: make(chan struct{})}
	args := append([]string{os.Args[0], "--serve", f.opts.ConfigPath, "-listen", "127.0.0.1:0",
		"-work-dir", f.opts.WorkDir, "-termination-log", f.opts.TerminationLogPath}, flags...)
	args = append(slices.Clone(wrapper), args...)
	s.cmd = exec.Command(args[0], args[1:]...)
	s.wrapped = len(wrapper) > 0
	s.cmd.Env = []string{runAsRunnerEnv + "=1", nodeKernelEnv + "=" + repositoryNodeKernel}
	s.cmd.Stderr = &s.stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.terminate() })
	reader := bufio.NewReader(stdout)
	first, err := reader.ReadBytes('\n')
	if err != nil {
		f.t.Fatalf("no credential line: %v (stderr %s)", err, s.stderr.String())
	}
	var line serveLine
	decoder := json.NewDecoder(bytes.NewReader(first))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&line); err != nil || len(line.Serve.Credential) != 2*credentialBytes {
		f.t.Fatalf("first line is not a credential line: %q (%v)", first, err)
	}
	s.port, s.credential = line.Serve.Port, line.Serve.Credential
	s.url = "http://127.0.0.1:" + strconv.Itoa(s.port)
	go func() {
		defer close(s.logDone)
		buf := make([]byte, 4096)
		for {
			n, err := reader.Read(buf)
			s.mu.Lock()
			s.log.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	s.waitReady()
	return s
}

func (s *servingRunner) waitReady() {
	s.f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		response, err := http.Get(s.url + "/ready")
		if err == nil {
			_ = response.Body.Close()
			if response.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			s.f.t.Fatalf("the runner never got ready: %v (stderr %s)", err, s.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// request is the POST /v1/run body for the fixture's program.
func (s *servingRunner) request(executionID string) runRequest {
	s.f.t.Helper()
	config, err := json.Marshal(s.f.config)
	if err != nil {
		s.f.t.Fatal(err)
	}
	request := runRequest{ExecutionID: executionID, Config: config, Source: s.f.source, Stdin: s.f.stdin}
	for key, content := range s.f.inputFiles {
		for _, mapping := range s.f.config.Files {
			if mapping.Key == key {
				request.Files = append(request.Files, inlineFile{Path: mapping.Path, Content: content})
			}
		}
	}
	return request
}

// post sends request with the given Authorization header value ("" for none).
func (s *servingRunner) post(request runRequest, authorization string) *http.Response {
	s.f.t.Helper()
	body, err := json.Marshal(request)
	if err != nil {
		s.f.t.Fatal(err)
	}
	httpRequest, err := http.NewRequest(http.MethodPost, s.url+"/v1/run", bytes.NewReader(body))
	if err != nil {
		s.f.t.Fatal(err)
	}
	if authorization != "" {
		httpRequest.Header.Set("Authorization", authorization)
	}
	response, err := http.DefaultClient.Do(httpRequest)
	if err != nil {
		s.f.t.Fatal(err)
	}
	s.f.t.Cleanup(func() { _ = response.Body.Close() })
	return response
}

func (s *servingRunner) bearer() string { return "Bearer " + s.credential }

// run posts the fixture's program as executionID and returns the whole
// response body, which must be a 200 stream of the run.
func (s *servingRunner) run(executionID string) []byte {
	s.f.t.Helper()
	response := s.post(s.request(executionID), s.bearer())
	return readStream(s.f.t, response)
}

func readStream(t testing.TB, response *http.Response) []byte {
	t.Helper()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		t.Fatal(err)
	}
	if response.StatusCode != http.StatusOK || response.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d (%s): %s", response.StatusCode, response.Header.Get("Content-Type"), body)
	}
	return body
}

// terminate stops the runner with SIGTERM; it must exit 0. A wrapped runner
// gets it when its wrapper is killed (unshare --kill-child).
func (s *servingRunner) terminate() {
	if s.cmd.ProcessState != nil {
		return
	}
	if s.wrapped {
		_ = s.cmd.Process.Kill()
	} else {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
	}
	<-s.logDone
	err := s.cmd.Wait()
	if s.wrapped && s.cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
		err = nil
	}
	unexpected := slices.DeleteFunc(strings.Split(strings.TrimSpace(s.stderr.String()), "\n"), func(line string) bool {
		return line == "" || (s.allowedStderr != "" && strings.Contains(line, s.allowedStderr))
	})
	if err != nil || len(unexpected) > 0 {
		s.f.t.Errorf("the serving runner ended with %v (stderr %q)", err, s.stderr.String())
	}
}

// podLog is the runner's stdout after the credential line, once it ended.
func (s *servingRunner) podLog() []byte {
	s.terminate()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Bytes()
}

func assertStatus(t *testing.T, response *http.Response, want int) {
	t.Helper()
	if response.StatusCode != want {
		body, _ := io.ReadAll(response.Body)
		t.Fatalf("status %d, want %d: %s", response.StatusCode, want, body)
	}
}
