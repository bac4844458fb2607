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
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	DefaultListenAddress = ":7070"
	// ExitCodeCannotServe: serve mode could not start serving (stderr says why).
	ExitCodeCannotServe = 1

	credentialBytes    = 32
	maxRunRequestBytes = 64 << 20
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

// Serve announces the credential, pre-starts the program and serves one run
// over HTTP until ctx is done; a run in progress then is killed and reports
// first. The error says it could not serve at all.
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
	if err != nil {
		return err
	}
	child, err := prestart(served, opts)
	if err != nil {
		return err
	}
	journal := newJournal()
	s := &server{
		opts: opts, stderr: stderr, credential: []byte(credential), served: served, child: child, runCtx: ctx,
		journal: journal, frames: newFrameWriter(io.MultiWriter(journal, stdout), newFrameKey()), done: make(chan struct{}),
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

// server serves the one run of a pre-started child.
type server struct {
	opts       Options
	stderr     io.Writer
	credential []byte
	served     Config
	child      *warmChild
	runCtx     context.Context
	journal    *journal
	frames     *frameWriter

	mu          sync.Mutex
	executionID string
	stopping    bool
	// done is closed once the run has reported.
	done chan struct{}
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("POST /v1/run", s.handleRun)
	return mux
}

func (s *server) handleRun(w http.ResponseWriter, r *http.Request) {
	if !s.authorized(r.Header.Get("Authorization")) {
		w.Header().Set("WWW-Authenticate", "Bearer")
		http.Error(w, "unauthorized", http.StatusUnauthorized)
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
	if status, err := s.claim(request); err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	s.stream(w, r)
}

func (s *server) authorized(header string) bool {
	token, found := strings.CutPrefix(header, "Bearer ")
	return found && subtle.ConstantTimeCompare([]byte(token), s.credential) == 1
}

// claim binds the pod to request's execution and starts it, or accepts a
// re-attach of the execution already bound.
func (s *server) claim(request runRequest) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case request.ExecutionID == "":
		return http.StatusBadRequest, errors.New("executionId must not be empty")
	case s.executionID == request.ExecutionID:
		return http.StatusOK, nil
	case s.executionID != "":
		return http.StatusConflict, errors.New("this sandbox serves another execution")
	case s.stopping:
		return http.StatusServiceUnavailable, errors.New("the runner is stopping")
	}
	cfg, err := ParseConfig(request.Config)
	if err == nil {
		err = checkServable(s.served, cfg)
	}
	if err != nil {
		return http.StatusBadRequest, err
	}
	s.executionID = request.ExecutionID
	go s.execute(cfg, request)
	return http.StatusOK, nil
}

func (s *server) execute(cfg Config, request runRequest) {
	defer close(s.done)
	defer s.journal.close()
	result := s.child.run(s.runCtx, cfg, request, s.frames)
	summary := s.frames.summary(result)
	// The HTTP answer is the result; the termination log is a courtesy.
	if err := writeTerminationLog(s.opts.TerminationLogPath, summary); err != nil {
		fmt.Fprintf(s.stderr, "sandpod-runner: writing the termination log: %v\n", err)
	}
	if err := s.frames.writeSummary(summary); err != nil {
		fmt.Fprintf(s.stderr, "sandpod-runner: writing the summary to the log: %v\n", err)
	}
}

// stream answers with every record of the run from the first, then follows
// until the summary.
func (s *server) stream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher := http.NewResponseController(w)
	offset := 0
	for {
		records, changed, complete := s.journal.since(offset)
		if len(records) > 0 {
			if _, err := w.Write(records); err != nil {
				return
			}
			_ = flusher.Flush()
			offset += len(records)
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
// the cancelled runCtx) reports first; an unused child is killed.
func (s *server) stop() {
	s.mu.Lock()
	s.stopping = true
	started := s.executionID != ""
	s.mu.Unlock()
	if started {
		<-s.done
	} else {
		s.child.abandon()
	}
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
