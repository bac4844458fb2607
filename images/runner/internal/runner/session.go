package runner

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"
)

// maxValueBytes bounds a session run's value (the trailing expression's
// repr); a longer one is cut and ends in "…".
const maxValueBytes = 64 << 10

// newSession is the executor of session mode: python runs in one persistent
// interpreter (kernel.go) when the command is [python…, sourceFile], and
// JavaScript and TypeScript in one node process when it is [node, flags…,
// sourceFile] (nodekernel.go); any other command in a fresh process per run.
// All share the work dir, which persists.
func newSession(served Config, opts Options) (executor, error) {
	if !usesPythonBootstrap(served) && !usesNodeKernel(served) {
		if err := createWorkDir(opts.WorkDir); err != nil {
			return nil, err
		}
		return &freshRuns{opts: opts}, nil
	}
	k, err := startKernel(served, opts)
	if err != nil {
		return nil, err
	}
	return &kernelSession{served: served, opts: opts, kernel: k}, nil
}

// freshRuns runs each request in a fresh process, as in one-off mode, in the
// work dir the runs share: files persist, nothing else does.
type freshRuns struct {
	opts Options
}

func (f *freshRuns) run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	result := f.runFresh(ctx, cfg, request, frames)
	result.setSession(nil, false, false)
	return result
}

func (f *freshRuns) runFresh(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	// Each run's outputs are its own: what an earlier run left there is not this run's.
	if err := resetOutputsDir(outputsDir(f.opts.WorkDir)); err != nil {
		return failedResult(err)
	}
	if err := writeRequestFiles(f.opts.WorkDir, withSource(cfg, request), true); err != nil {
		return failedResult(err)
	}
	return runWithStdin(ctx, cfg, f.opts, request.Stdin, frames)
}

func (f *freshRuns) close() {}

// kernelSession runs requests in one persistent interpreter. When a
// run times out or the interpreter dies, it is killed and a fresh one
// started: that run and the next say stateLost.
type kernelSession struct {
	served Config
	opts   Options

	// mu is held by a run and by a restart.
	mu     sync.Mutex
	kernel *kernel
	// lost: the state was lost since the last run began.
	lost   bool
	closed bool
	// runs numbers the runs, for the names their code gets (<cell N>).
	runs int
}

func (s *kernelSession) run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs++
	stateLost := s.lost
	s.lost = false
	result, value, alive := s.runInKernel(ctx, cfg, request, frames)
	if !alive {
		s.kernel, s.lost, stateLost = nil, true, true
		// In the background, so that the summary is not kept waiting.
		go s.restart()
	}
	result.setSession(value, stateLost, true)
	return result
}

// runInKernel runs request in the kernel, starting one if there is none: its
// result, its value, and alive false when the kernel had to be killed.
func (s *kernelSession) runInKernel(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) (Result, *string, bool) {
	if s.kernel == nil {
		k, err := startKernel(s.served, s.opts)
		if err != nil {
			return failedResult(fmt.Errorf("the session's interpreter could not be restarted: %w", err)), nil, false
		}
		s.kernel = k
	}
	if err := writeRequestFiles(s.opts.WorkDir, request.Files, true); err != nil {
		return failedResult(err), nil, true
	}
	return s.kernel.run(ctx, cfg, request, s.runs, frames)
}

// restart starts a fresh kernel after a lost one, unless a run did already.
func (s *kernelSession) restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kernel != nil || s.closed {
		return
	}
	// A failure shows in the next run, which tries again.
	if k, err := startKernel(s.served, s.opts); err == nil {
		s.kernel = k
	}
}

func (s *kernelSession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.kernel != nil {
		s.kernel.kill()
		s.kernel = nil
	}
}

// setSession adds the session fields to a result: value (nil for null),
// stateLost, and kernel (the run went through the session's kernel:
// its result is the kernel's word, not only the runner's observation).
func (r *Result) setSession(value *string, stateLost, kernel bool) {
	r.Value = &programValue{Text: boundValue(value)}
	r.StateLost = &stateLost
	r.Kernel = &kernel
}

// boundValue cuts value to maxValueBytes of UTF-8, ending in "…" when cut.
func boundValue(value *string) *string {
	if value == nil || len(*value) <= maxValueBytes {
		return value
	}
	const ellipsis = "…"
	cut := maxValueBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart((*value)[cut]) {
		cut--
	}
	bounded := (*value)[:cut] + ellipsis
	return &bounded
}
