package runner

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// compileOutputLimit bounds the compiler's output kept in the summary (its
// stdout and stderr together, the first bytes: compilers report the first
// error first).
const compileOutputLimit = 16 << 10

// CompileResult is what became of the compile step (config.compileCommand),
// run before the program in the same work dir, environment, limits and
// seccomp filter, within its own time limit (config.compileTimeoutSeconds):
// the program's timeout starts when the program does.
type CompileResult struct {
	// Output is the compiler's stdout and stderr as written, interleaved, cut
	// at compileOutputLimit bytes (OutputTruncated then says so).
	Output          string `json:"output"`
	OutputTruncated bool   `json:"outputTruncated"`
	// How the compiler ended: ExitCode is null when a signal killed it.
	DurationMs int64 `json:"durationMs"`
	TimedOut   bool  `json:"timedOut"`
	ExitCode   *int  `json:"exitCode"`
	Signal     *int  `json:"signal"`
}

func (c *CompileResult) succeeded() bool {
	return c.ExitCode != nil && *c.ExitCode == 0
}

// compileFirst runs the compile step of cfg, if it has one, killed at its own
// time limit. ok is false when the program must not run: the result to report
// is then final.
func compileFirst(ctx context.Context, spec processSpec, cfg Config) (compiled *CompileResult, final Result, ok bool) {
	if len(cfg.CompileCommand) == 0 {
		return nil, Result{}, true
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, failedResult(fmt.Errorf("opening stdin of the compiler: %w", err)), false
	}
	defer devNull.Close()
	compileSpec := spec
	compileSpec.argv = cfg.CompileCommand
	compileSpec.stdin = devNull
	compileSpec.timeout = time.Duration(cfg.CompileTimeoutSeconds) * time.Second
	output := &lockedWriter{buffer: cappedBuffer{limit: compileOutputLimit}}
	outcome := runProcess(ctx, compileSpec, output, output)
	if outcome.startErr != nil {
		return nil, failedResult(fmt.Errorf("the compiler could not start: %w", outcome.startErr)), false
	}
	compiled = &CompileResult{
		ExitCode:        outcome.exitCode,
		Signal:          outcome.signal,
		TimedOut:        outcome.timedOut,
		DurationMs:      outcome.duration.Milliseconds(),
		Output:          strings.ToValidUTF8(string(output.buffer.data), "\uFFFD"),
		OutputTruncated: output.buffer.Truncated(),
	}
	if !compiled.succeeded() {
		return compiled, Result{Compile: compiled, TimedOut: compiled.TimedOut}, false
	}
	return compiled, Result{}, true
}

// checkNoCompileStep refuses a compile step in a session, whose runs share
// one interpreter (a pool's sandbox builds its one run: build.go).
func checkNoCompileStep(cfg Config) error {
	if len(cfg.CompileCommand) > 0 {
		return fmt.Errorf("a session does not run a compile step (compileCommand %q)", cfg.CompileCommand)
	}
	return nil
}

// lockedWriter lets the compiler's stdout and stderr readers share one buffer.
type lockedWriter struct {
	mu     sync.Mutex
	buffer cappedBuffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buffer.Write(p)
}
