package runner

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fixture is one runner invocation: its input files and paths in a temp dir.
type fixture struct {
	t          testing.TB
	opts       Options
	config     Config
	source     string
	stdin      *string
	inputFiles map[string]string
}

func newPythonFixture(t testing.TB, source string) *fixture {
	t.Helper()
	root := t.TempDir()
	return &fixture{
		t: t,
		opts: Options{
			ConfigPath:         filepath.Join(root, "input", "config.json"),
			InputDir:           filepath.Join(root, "input"),
			WorkDir:            filepath.Join(root, "tmp", "work"),
			TerminationLogPath: filepath.Join(root, "termination-log"),
		},
		config: Config{
			Mode:           ModeRun,
			SourceFile:     "main.py",
			Command:        []string{"python3", "main.py"},
			Args:           []string{},
			Env:            map[string]string{"PYTHONUNBUFFERED": "1"},
			TimeoutSeconds: 10,
			MaxOutputBytes: DefaultMaxOutputBytes,
			Files:          []FileMapping{},
			Limits:         Limits{Processes: 128, FileSizeBytes: 100 << 20, OpenFiles: 1024},
		},
		source:     source,
		inputFiles: map[string]string{},
	}
}

func newShellFixture(t *testing.T, script string) *fixture {
	t.Helper()
	f := newPythonFixture(t, script)
	f.config.SourceFile = "main.sh"
	f.config.Command = []string{"/bin/sh", "main.sh"}
	f.config.Env = map[string]string{}
	return f
}

func (f *fixture) writeInputs() {
	f.t.Helper()
	if err := os.MkdirAll(f.opts.InputDir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	config, err := json.Marshal(f.config)
	if err != nil {
		f.t.Fatal(err)
	}
	files := map[string]string{"config.json": string(config), "source": f.source}
	if f.stdin != nil {
		files["stdin"] = *f.stdin
	}
	for key, content := range f.inputFiles {
		files[key] = content
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(f.opts.InputDir, name), []byte(content), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
}

// runnerOutput is the runner's pod log, decoded and verified.
type runnerOutput struct {
	frames  []outputFrame
	result  Result
	summary summaryRecord
}

func (o runnerOutput) text(stream string) string {
	var text strings.Builder
	for _, frame := range o.frames {
		if frame.Stream == stream {
			text.WriteString(frame.Data)
		}
	}
	return text.String()
}

// run runs the runner in this process and checks the protocol's invariants:
// JSON lines, the result last, the same result in the termination log.
func (f *fixture) run(ctx context.Context) runnerOutput {
	f.t.Helper()
	f.writeInputs()
	var log bytes.Buffer
	result, err := Run(ctx, f.opts, &log)
	if err != nil {
		f.t.Fatalf("the runner could not report: %v", err)
	}
	output := f.decodeLog(log.Bytes())
	assertSameJSON(f.t, "returned result", result, output.result)
	return output
}

// runInProcess runs the built runner (this test binary) as its own process.
func (f *fixture) runInProcess(configure func(*exec.Cmd)) (runnerOutput, *os.ProcessState) {
	f.t.Helper()
	log, state := f.execRunner(configure)
	if code := state.ExitCode(); code != ExitCodeReported {
		f.t.Fatalf("runner exit status %d, want %d with a summary", code, ExitCodeReported)
	}
	return f.decodeLog(log), state
}

// runnerDeadline is how long a runner process may take before its test fails:
// far beyond any run here, it only stops a runner that would never finish.
const runnerDeadline = 3 * time.Minute

// execRunner runs the runner as its own process and returns its raw log.
func (f *fixture) execRunner(configure func(*exec.Cmd)) ([]byte, *os.ProcessState) {
	f.t.Helper()
	f.writeInputs()
	ctx, cancel := context.WithTimeout(context.Background(), runnerDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0],
		"-work-dir", f.opts.WorkDir, "-termination-log", f.opts.TerminationLogPath, f.opts.ConfigPath)
	cmd.Env = []string{runAsRunnerEnv + "=1"}
	var log, stderr bytes.Buffer
	cmd.Stdout = &log
	cmd.Stderr = &stderr
	if configure != nil {
		configure(cmd)
	}
	err := cmd.Run()
	if ctx.Err() != nil {
		f.t.Fatalf("the runner did not finish in %v: %s", runnerDeadline, stderr.String())
	}
	if errors.Is(err, syscall.EPERM) && cmd.SysProcAttr != nil && cmd.SysProcAttr.Cloneflags != 0 {
		f.t.Skipf("creating namespaces is not permitted here: %v", err)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		f.t.Fatalf("running the runner: %v", err)
	}
	if stderr.Len() > 0 && cmd.ProcessState.ExitCode() == ExitCodeReported {
		f.t.Errorf("runner wrote to stderr: %s", stderr.String())
	}
	return log.Bytes(), cmd.ProcessState
}

// decodeLog decodes the pod log and checks the protocol's invariants: output
// frames numbered from 1 whose MACs verify under the summary's key, the
// summary last, the same summary in the termination log.
func (f *fixture) decodeLog(log []byte) runnerOutput {
	f.t.Helper()
	output := f.decodeRecords(log)
	terminationLog, err := os.ReadFile(f.opts.TerminationLogPath)
	if err != nil {
		f.t.Fatalf("reading the termination log: %v", err)
	}
	if len(terminationLog) > MaxTerminationMessageBytes {
		f.t.Errorf("termination log has %d bytes, more than %d", len(terminationLog), MaxTerminationMessageBytes)
	}
	var terminationSummary summaryRecord
	if err := json.Unmarshal(terminationLog, &terminationSummary); err != nil {
		f.t.Fatalf("termination log is not a summary: %q (%v)", terminationLog, err)
	}
	// What the termination message holds: the summary, shortened to fit.
	var wantTermination summaryRecord
	if err := json.Unmarshal(TerminationMessage(output.summary), &wantTermination); err != nil {
		f.t.Fatal(err)
	}
	assertSameJSON(f.t, "termination log summary", wantTermination, terminationSummary)
	return output
}

// decodeRecords decodes one run's records: output frames numbered from 1
// whose MACs verify under the summary's key, the summary last.
func (f *fixture) decodeRecords(log []byte) runnerOutput {
	f.t.Helper()
	lines := bytes.Split(bytes.TrimSuffix(log, []byte("\n")), []byte("\n"))
	var output runnerOutput
	summaryDecoder := json.NewDecoder(bytes.NewReader(lines[len(lines)-1]))
	summaryDecoder.DisallowUnknownFields()
	if err := summaryDecoder.Decode(&output.summary); err != nil || len(output.summary.Key) != 2*frameKeyBytes {
		f.t.Fatalf("last log line is not a summary: %q (%v)", lines[len(lines)-1], err)
	}
	output.result = output.summary.Result
	key, err := hex.DecodeString(output.summary.Key)
	if err != nil {
		f.t.Fatal(err)
	}
	for i, line := range lines[:len(lines)-1] {
		var frame outputFrame
		decoder := json.NewDecoder(bytes.NewReader(line))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(&frame); err != nil || frame.Stream == "" {
			f.t.Fatalf("log line %d is not an output record: %q (%v)", i, line, err)
		}
		if frame.Seq != uint64(i+1) || !verifyFrame(key, frame) {
			f.t.Fatalf("log line %d does not verify as frame %d: %q", i, i+1, line)
		}
		if len(frame.Data) > maxFrameDataBytes {
			f.t.Errorf("output record of %d bytes exceeds %d", len(frame.Data), maxFrameDataBytes)
		}
		output.frames = append(output.frames, frame)
	}
	if output.summary.Frames != uint64(len(output.frames)) {
		f.t.Errorf("summary counts %d frames, the log has %d", output.summary.Frames, len(output.frames))
	}
	return output
}

func assertSameJSON(t testing.TB, what string, want, got any) {
	t.Helper()
	wantJSON, _ := json.Marshal(want)
	gotJSON, _ := json.Marshal(got)
	if !bytes.Equal(wantJSON, gotJSON) {
		t.Errorf("%s:\n got %s\nwant %s", what, gotJSON, wantJSON)
	}
}

func intPtr(v int) *int { return &v }

func assertExit(t *testing.T, output runnerOutput, exitCode *int, signal *int) {
	t.Helper()
	assertSameJSON(t, "exitCode", exitCode, output.result.ExitCode)
	assertSameJSON(t, "signal", signal, output.result.Signal)
}

// waitGone waits until every pid is gone, failing at the deadline.
func waitGone(t *testing.T, pids []int, deadline time.Duration) {
	t.Helper()
	limit := time.Now().Add(deadline)
	for _, pid := range pids {
		for !processGoneOrZombie(pid) {
			if time.Now().After(limit) {
				t.Fatalf("process %d from the run is still alive", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// processesIn lists the live processes whose working directory is dir.
func processesIn(t *testing.T, dir string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", entry.Name(), "cwd"))
		if err == nil && cwd == dir && !processGoneOrZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func readPids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading pids the program wrote: %v", err)
	}
	var pids []int
	for _, field := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(field)
		if err != nil {
			t.Fatalf("bad pid %q", field)
		}
		pids = append(pids, pid)
	}
	return pids
}
