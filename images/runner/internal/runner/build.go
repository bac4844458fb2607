package runner

import (
	"context"
	"fmt"
	"os"
)

// buildOnRequest serves the one run of a compiled language's pool sandbox.
// Nothing starts ahead of the request: a pre-started program cannot wait for
// a build of a source it has not seen (and as PID 1 the build's end would
// reap it). The run writes its files, then builds and runs the program as a
// one-off run does (compile.go): the same limits, filter and time limits.
type buildOnRequest struct {
	opts Options
}

// prepareBuild makes the work dir the run will build in.
func prepareBuild(opts Options) (*buildOnRequest, error) {
	if err := createWorkDir(opts.WorkDir); err != nil {
		return nil, err
	}
	return &buildOnRequest{opts: opts}, nil
}

func (b *buildOnRequest) run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	if err := writeRequestFiles(b.opts.WorkDir, withSource(cfg, request), false); err != nil {
		return failedResult(err)
	}
	return runWithStdin(ctx, cfg, b.opts, request.Stdin, frames)
}

// runWithStdin runs the program of cfg in a fresh process fed stdin.
func runWithStdin(ctx context.Context, cfg Config, opts Options, stdin *string, frames *frameWriter) Result {
	stdinRead, stdinWrite, err := os.Pipe()
	if err != nil {
		return failedResult(fmt.Errorf("creating the stdin pipe: %w", err))
	}
	// Closed once the run is over: a program that never ran (a failed build)
	// or left stdin unread ends the feeding with EPIPE.
	defer stdinRead.Close()
	go feedStdin(stdinWrite, stdin)
	return runProgram(ctx, newProcessSpec(cfg, opts, stdinRead), cfg, frames)
}

// close has nothing to stop: nothing runs between requests.
func (b *buildOnRequest) close() {}
