package runner

import (
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	DefaultListenAddress = ":7070"
	// ExitCodeCannotServe: serve mode could not start serving (stderr says why).
	ExitCodeCannotServe = 1

	credentialBytes    = 32
	maxRunRequestBytes = 64 << 20
	// interruptGrace is how long a cancelled session run has to end after its
	// interrupt (SIGINT) before the kernel is killed.
	interruptGrace = 2 * time.Second
	// shutdownGrace bounds how long responses still stream after SIGTERM,
	// once the run (if any) has reported.
	shutdownGrace     = 2 * time.Second
	readHeaderTimeout = 10 * time.Second
)

// serveLine is serve mode's first stdout line: where to reach the runner and
// the credential it accepts.
type serveLine struct {
	Serve serveEndpoint `json:"serve"`
}

type serveEndpoint struct {
	Port       int    `json:"port"`
	Credential string `json:"credential"`
}

// runStartLine starts each run's records in the pod log (never in its answer).
type runStartLine struct {
	Run runStart `json:"run"`
}

type runStart struct {
	ExecutionID string `json:"executionId"`
}

// runRequest is the body of POST /v1/run.
type runRequest struct {
	ExecutionID string          `json:"executionId"`
	Config      json.RawMessage `json:"config"`
	Source      string          `json:"source"`
	Stdin       *string         `json:"stdin"`
	Files       []inlineFile    `json:"files"`
}

type inlineFile struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	// Encoding is "" (Content is the text) or "base64".
	Encoding string `json:"encoding,omitempty"`
}

func serveMain(opts Options, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Serve(ctx, opts, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "sandpod-runner: %v\n", err)
		return ExitCodeCannotServe
	}
	return ExitCodeReported
}

// executor runs the requests of a serving runner: the one pre-started child
// (serve mode), the one build and run of a compiled language (build.go), or a
// session's runs (session.go).
type executor interface {
	// run runs one request to its end; frames get its output.
	run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result
	// close kills what still waits to run; no run is in progress.
	close()
}

// Serve announces the credential, prepares the executor and serves runs over
// HTTP until ctx is done: one run in serve mode, one at a time in session
// mode. A run in progress at the end is killed and reports first. The error
// says it could not serve at all.
func Serve(ctx context.Context, opts Options, stdout, stderr io.Writer) error {
	if err := makeNonDumpable(); err != nil {
		return err
	}
	credential := hex.EncodeToString(randomSecret(credentialBytes))
	listener, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return err
	}
	defer listener.Close()
	port := listener.Addr().(*net.TCPAddr).Port
	if _, err := stdout.Write(marshalJSONLine(serveLine{serveEndpoint{Port: port, Credential: credential}})); err != nil {
		return fmt.Errorf("writing the credential line: %w", err)
	}
	served, err := LoadConfig(opts.ServeConfigPath)
	if err == nil && served.Mode != ModeRun {
		err = fmt.Errorf("serve mode runs programs only, not mode %q", served.Mode)
	}
	if err == nil && opts.Session {
		err = checkNoCompileStep(served)
	}
	if err != nil {
		return err
	}
	var runs executor
	switch {
	case opts.Session:
		runs, err = newSession(served, opts)
	case len(served.CompileCommand) > 0:
		runs, err = prepareBuild(opts)
	case served.MaxRuns > 1:
		runs, err = newBoxedRuns(served, opts, func(problem error) {
			fmt.Fprintf(stderr, "sandpod-runner: %v\n", problem)
		})
	default:
		runs, err = prestart(served, opts, nil)
	}
	if err != nil {
		return err
	}
	s := &server{
		opts: opts, stdout: stdout, stderr: stderr, credential: []byte(credential), served: served,
		executor: runs, session: opts.Session, runCtx: ctx,
		many: !opts.Session && served.MaxRuns > 1 && len(served.CompileCommand) == 0,
	}
	httpServer := &http.Server{Handler: s.routes(), ReadHeaderTimeout: readHeaderTimeout}
	go func() { _ = httpServer.Serve(listener) }()
	<-ctx.Done()
	s.stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if httpServer.Shutdown(shutdownCtx) != nil {
		_ = httpServer.Close()
	}
	return nil
}

const (
	// keptRuns bounds the runs whose records a re-attach can replay.
	keptRuns = 4
	// rememberedRuns bounds the older runs whose ids get 404 rather than
	// starting anew.
	rememberedRuns = 1024
)

// server serves the runs of one pod.
type server struct {
	opts       Options
	stdout     io.Writer
	stderr     io.Writer
	credential []byte
	served     Config
	executor   executor
	session    bool
	// many: a sandbox of many runs, each in its own box (box.go).
	many   bool
	runCtx context.Context

	mu sync.Mutex
	// runs are the kept records, oldest first; forgotten the ids of older runs.
	runs      []*runRecord
	forgotten []string
	busy      bool
	stopping  bool
	// active counts the runs that have not reported yet.
	active sync.WaitGroup
}

// runRecord is one run: its execution id and every record it wrote.
type runRecord struct {
	executionID string
	journal     *journal
	// stop cancels the run's context with errCancelRequested (POST /v1/cancel).
	stop context.CancelCauseFunc
	// ended (under server.mu): the run has its result; cancelled: a cancel
	// arrived before that.
	ended     bool
	cancelled atomic.Bool
}

// errCancelRequested is the cause of a run's context cancelled by POST
// /v1/cancel (a python kernel is interrupted first; anything else is killed).
var errCancelRequested = errors.New("the run was cancelled on request")

// cancelRequest is the body of POST /v1/cancel.
type cancelRequest struct {
	ExecutionID string `json:"executionId"`
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("POST /v1/run", s.handleRun)
	mux.HandleFunc("POST /v1/cancel", s.handleCancel)
	return mux
}

func (s *server) handleRun(w http.ResponseWriter, r *http.Request) {
	if !s.admit(w, r) {
		return
	}
	var request runRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRunRequestBytes)).Decode(&request); err != nil {
		status := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, "invalid request body: "+err.Error(), status)
		return
	}
	record, status, err := s.claim(request)
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	stream(w, r, record.journal)
}

// handleCancel stops the run in progress of the given execution: 202, or 409
// when that execution has no run in progress here.
func (s *server) handleCancel(w http.ResponseWriter, r *http.Request) {
	if !s.admit(w, r) {
		return
	}
	var request cancelRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&request); err != nil {
		http.Error(w, "invalid request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	index := slices.IndexFunc(s.runs, func(r *runRecord) bool { return r.executionID == request.ExecutionID })
	if index < 0 || s.runs[index].ended {
		http.Error(w, "this execution has no run in progress", http.StatusConflict)
		return
	}
	s.runs[index].cancelled.Store(true)
	s.runs[index].stop(errCancelRequested)
	w.WriteHeader(http.StatusAccepted)
}

// admit answers 401 unless the request carries the credential.
func (s *server) admit(w http.ResponseWriter, r *http.Request) bool {
	if s.authorized(r.Header.Get("Authorization")) {
		return true
	}
	w.Header().Set("WWW-Authenticate", "Bearer")
	http.Error(w, "unauthorized", http.StatusUnauthorized)
	return false
}

func (s *server) authorized(header string) bool {
	token, found := strings.CutPrefix(header, "Bearer ")
	return found && subtle.ConstantTimeCompare([]byte(token), s.credential) == 1
}

// claim starts request's run, or finds the run of the same execution for a
// re-attach.
func (s *server) claim(request runRequest) (*runRecord, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := request.ExecutionID
	if index := slices.IndexFunc(s.runs, func(r *runRecord) bool { return r.executionID == id }); index >= 0 {
		return s.runs[index], http.StatusOK, nil
	}
	switch {
	case id == "":
		return nil, http.StatusBadRequest, errors.New("executionId must not be empty")
	case slices.Contains(s.forgotten, id):
		return nil, http.StatusNotFound, errors.New("this run is no longer kept")
	case s.busy:
		return nil, http.StatusConflict, errors.New("another execution is running in this sandbox")
	case !s.session && !s.many && len(s.runs) > 0:
		return nil, http.StatusGone, errRetired
	case s.stopping:
		return nil, http.StatusServiceUnavailable, errors.New("the runner is stopping")
	}
	if runs, ok := s.executor.(*boxedRuns); ok {
		if err := runs.accepting(); err != nil {
			return nil, http.StatusGone, err
		}
	}
	cfg, err := ParseConfig(request.Config)
	if err == nil {
		err = checkServable(s.served, cfg)
	}
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	runCtx, stop := context.WithCancelCause(s.runCtx)
	record := &runRecord{executionID: id, journal: newJournal(), stop: stop}
	s.keep(record)
	s.busy = true
	s.active.Add(1)
	go s.execute(runCtx, record, cfg, request)
	return record, http.StatusOK, nil
}

// keep adds record, forgetting the oldest kept run's records beyond keptRuns.
func (s *server) keep(record *runRecord) {
	s.runs = append(s.runs, record)
	if len(s.runs) > keptRuns {
		s.forgotten = append(s.forgotten, s.runs[0].executionID)
		s.runs = slices.Delete(s.runs, 0, 1)
	}
	if len(s.forgotten) > rememberedRuns {
		s.forgotten = slices.Delete(s.forgotten, 0, 1)
	}
}

// execute runs the request under its own frame key and reports its summary.
func (s *server) execute(ctx context.Context, record *runRecord, cfg Config, request runRequest) {
	defer s.active.Done()
	// In the pod log, whose runs follow one another, this line says whose frames come next.
	if _, err := s.stdout.Write(marshalJSONLine(runStartLine{runStart{ExecutionID: record.executionID}})); err != nil {
		fmt.Fprintf(s.stderr, "sandpod-runner: writing the run's first log line: %v\n", err)
	}
	frames := newFrameWriter(io.MultiWriter(record.journal, s.stdout), newFrameKey())
	result := s.executor.run(ctx, cfg, request, frames)
	s.mu.Lock()
	record.ended = true
	s.mu.Unlock()
	record.stop(nil)
	result.Cancelled = record.cancelled.Load()
	if !s.session && !s.many {
		result.Retiring = true
	}
	summary := frames.summary(result)
	// The HTTP answer is the result; the termination log is a courtesy.
	if err := writeTerminationLog(s.opts.TerminationLogPath, summary); err != nil {
		fmt.Fprintf(s.stderr, "sandpod-runner: writing the termination log: %v\n", err)
	}
	// Free as the summary is written, under the lock a new run is claimed under: whoever
	// read the summary may post the next run at once (never a 409), and that run's first
	// log line comes after this summary.
	s.mu.Lock()
	if err := frames.writeSummary(summary); err != nil {
		fmt.Fprintf(s.stderr, "sandpod-runner: writing the summary to the log: %v\n", err)
	}
	s.busy = false
	s.mu.Unlock()
	record.journal.close()
}

// stream answers with every record of the run from the first, then follows
// until the summary.
func stream(w http.ResponseWriter, r *http.Request, records *journal) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher := http.NewResponseController(w)
	offset := 0
	for {
		pending, changed, complete := records.since(offset)
		if len(pending) > 0 {
			if _, err := w.Write(pending); err != nil {
				return
			}
			_ = flusher.Flush()
			offset += len(pending)
		}
		if complete {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

// stop ends serving: no run starts any more; a run in progress (killed by
// the cancelled runCtx) reports first; then what waits to run is killed.
func (s *server) stop() {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	s.active.Wait()
	s.executor.close()
}

// journal keeps every record of the run, for responses that start late.
type journal struct {
	mu       sync.Mutex
	records  []byte
	complete bool
	changed  chan struct{}
}

func newJournal() *journal {
	return &journal{changed: make(chan struct{})}
}

// Write appends whole records; it never fails.
func (j *journal) Write(p []byte) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.records = append(j.records, p...)
	close(j.changed)
	j.changed = make(chan struct{})
	return len(p), nil
}

func (j *journal) close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.complete = true
	close(j.changed)
	j.changed = make(chan struct{})
}

// since returns the records after offset, a channel closed at the next
// change, and whether the journal is complete (nothing will follow).
func (j *journal) since(offset int) ([]byte, <-chan struct{}, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.records[offset:], j.changed, j.complete
}
