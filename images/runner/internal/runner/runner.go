package runner

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

const (
	DefaultConfigPath         = "/sandbox/input/config.json"
	DefaultWorkDir            = "/tmp/work"
	DefaultTerminationLogPath = "/dev/termination-log"

	selfExePath = "/proc/self/exe"
	// lintReportLimit bounds the linter's JSON report kept for parsing.
	lintReportLimit = 16 << 20
)

// Options are the runner's paths; the defaults are the protocol's.
type Options struct {
	ConfigPath string
	// InputDir holds source, stdin and the extra files; by default the
	// directory of ConfigPath.
	InputDir           string
	WorkDir            string
	TerminationLogPath string
	// ServeConfigPath, when set, selects serve mode (serve.go): the config
	// the program is pre-started from; Listen is the HTTP address.
	ServeConfigPath string
	Listen          string
	// Session (with ServeConfigPath) serves many runs, one at a time, that
	// share the work dir and, for python, one interpreter (session.go).
	Session bool
}

// ParseOptions parses the command line: [flags] [config.json].
func ParseOptions(args []string, usageOutput io.Writer) (Options, error) {
	opts := Options{
		ConfigPath:         DefaultConfigPath,
		WorkDir:            DefaultWorkDir,
		TerminationLogPath: DefaultTerminationLogPath,
	}
	flags := flag.NewFlagSet("sandpod-runner", flag.ContinueOnError)
	flags.SetOutput(usageOutput)
	flags.Usage = func() {
		fmt.Fprintln(usageOutput, "usage: sandpod-runner [flags] [config.json]")
		flags.PrintDefaults()
	}
	flags.StringVar(&opts.InputDir, "input-dir", "", "directory of the input files (default: the directory of config.json)")
	flags.StringVar(&opts.WorkDir, "work-dir", opts.WorkDir, "scratch directory the program runs in")
	flags.StringVar(&opts.TerminationLogPath, "termination-log", opts.TerminationLogPath, "file the result summary is written to")
	flags.StringVar(&opts.ServeConfigPath, "serve", "", "serve mode: pre-start the program from this config and serve one run over HTTP")
	flags.StringVar(&opts.Listen, "listen", DefaultListenAddress, "serve mode: the HTTP address")
	flags.BoolVar(&opts.Session, "session", false, "with -serve: serve many runs, one at a time, sharing the work dir and state")
	if err := flags.Parse(args); err != nil {
		return opts, err
	}
	switch flags.NArg() {
	case 0:
	case 1:
		if opts.ServeConfigPath != "" {
			return opts, fmt.Errorf("serve mode takes no config path argument, got %q", flags.Args())
		}
		opts.ConfigPath = flags.Arg(0)
	default:
		return opts, fmt.Errorf("expected at most one config path, got %q", flags.Args())
	}
	if opts.Session && opts.ServeConfigPath == "" {
		return opts, errors.New("-session needs -serve")
	}
	if opts.InputDir == "" {
		opts.InputDir = filepath.Dir(opts.ConfigPath)
	}
	return opts, nil
}

// Main is the runner's command: it returns the exit status of the process,
// ExitCodeReported exactly when it wrote its summary.
func Main(args []string, stdout, stderr io.Writer) int {
	opts, err := ParseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitCodeUsage
	}
	if err == nil && opts.ServeConfigPath != "" {
		return serveMain(opts, stdout, stderr)
	}
	if err == nil {
		// Before the program exists: a process of the same uid must not be
		// able to open the runner's descriptors or read its memory (the key).
		err = makeNonDumpable()
	}
	if err != nil {
		err = report(opts, failedResult(err), newFrameWriter(stdout, newFrameKey()))
	} else {
		// The kubelet stops a deleted pod with SIGTERM; the program goes first.
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		_, err = Run(ctx, opts, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandpod-runner: %v\n", err)
		return ExitCodeNoSummary
	}
	return ExitCodeReported
}

// Run runs the configured program once, frames its output on stdout, and
// reports the summary as the last record and in the termination log. The
// error says the summary could not be written.
func Run(ctx context.Context, opts Options, stdout io.Writer) (Result, error) {
	frames := newFrameWriter(stdout, newFrameKey())
	result := execute(ctx, opts, frames)
	return result, report(opts, result, frames)
}

// report writes the summary once the program and everything it started are
// gone: first over the termination log, then as the last pod log line.
func report(opts Options, result Result, frames *frameWriter) error {
	summary := frames.summary(result)
	if err := writeTerminationLog(opts.TerminationLogPath, summary); err != nil {
		return fmt.Errorf("writing the termination log: %w", err)
	}
	if err := frames.writeSummary(summary); err != nil {
		return fmt.Errorf("writing the summary to the log: %w", err)
	}
	return nil
}

func execute(ctx context.Context, opts Options, frames *frameWriter) Result {
	cfg, err := LoadConfig(opts.ConfigPath)
	if err != nil {
		return failedResult(err)
	}
	if err := prepareWorkDir(&cfg, opts.InputDir, opts.WorkDir); err != nil {
		return failedResult(err)
	}
	// Lint mode runs no program, so nothing reads the program's stdin.
	stdin, err := openStdin(cfg.HasStdin && cfg.Mode == ModeRun, opts.InputDir)
	if err != nil {
		return failedResult(err)
	}
	defer stdin.Close()

	spec := newProcessSpec(cfg, opts, stdin)
	if cfg.Mode == ModeLint {
		spec.argv = cfg.LintCommand
		return lint(ctx, spec, cfg, frames)
	}
	return runProgram(ctx, spec, cfg, frames)
}

// runProgram builds the program first when the language has a compile step
// (a failed build is the result), then starts cfg's command with its args as
// spec says and runs it to its end, framing its output.
func runProgram(ctx context.Context, spec processSpec, cfg Config, frames *frameWriter) Result {
	compiled, final, ok := compileFirst(ctx, spec, cfg)
	if !ok {
		return final
	}
	spec.argv = append(slices.Clone(cfg.Command), cfg.Args...)
	var result Result
	if usesPythonBootstrap(cfg) {
		result = runPython(ctx, spec, cfg, frames)
	} else {
		result = runCaptured(cfg, frames, outputsDir(spec.dir), func(stdout, stderr io.Writer) processOutcome {
			return runProcess(ctx, spec, stdout, stderr)
		})
	}
	result.Compile = compiled
	return result
}

// runPython runs a python program through the bootstrap, as `python3
// main.py` runs it, with the bootstrap's value channel as fd 3.
func runPython(ctx context.Context, spec processSpec, cfg Config, frames *frameWriter) Result {
	channel, channelWrite, err := os.Pipe()
	if err != nil {
		return failedResult(fmt.Errorf("creating the value channel: %w", err))
	}
	reported := readValue(channel)
	argv := append([]string{cfg.Command[0], "-c", pythonBootstrap}, spec.argv[1:]...)
	// The waiting shim with a program execs it at once; its error pipe is
	// after the channel, where serve mode has the release socket.
	shim := shimArgv(spec.selfExe, spec.limits, spec.guard, shimWait, spec.box, argv)
	result := runCaptured(cfg, frames, outputsDir(spec.dir), func(stdout, stderr io.Writer) processOutcome {
		child, err := startProcess(spec, shim, channelWrite)
		_ = channelWrite.Close()
		if err != nil {
			return processOutcome{startErr: err}
		}
		return child.finish(ctx, spec, stdout, stderr)
	})
	result.setValue(reported.value())
	return result
}

// newProcessSpec is how every program starts: the clean environment in the
// work dir, under the config's limits and timeout, guarded against hurting
// the runner. argv is the caller's.
func newProcessSpec(cfg Config, opts Options, stdin *os.File) processSpec {
	return processSpec{
		env:     programEnv(cfg.Env, opts.WorkDir),
		dir:     opts.WorkDir,
		stdin:   stdin,
		limits:  cfg.Limits,
		timeout: time.Duration(cfg.TimeoutSeconds) * time.Second,
		// Validated: never negative.
		memoryLimit: uint64(cfg.MemoryLimitBytes),
		selfExe:     selfExePath,
		guard:       guardTarget{Pid: os.Getpid(), Pgid: syscall.Getpgrp()},
		reapAll:     os.Getpid() == 1,
	}
}

// runCaptured frames the program's stdout and stderr as run produces them,
// then the files it left in outputs, and returns the run's result.
func runCaptured(cfg Config, frames *frameWriter, outputs string, run func(stdout, stderr io.Writer) processOutcome) Result {
	stdoutCapture := newStreamCapture(StreamStdout, cfg.MaxOutputBytes, frames)
	stderrCapture := newStreamCapture(StreamStderr, cfg.MaxOutputBytes, frames)
	outcome := run(stdoutCapture, stderrCapture)
	stdoutCapture.finish()
	stderrCapture.finish()
	result := newResult(outcome, stdoutCapture, stderrCapture)
	if outcome.startErr == nil {
		result.addOutputs(collectOutputs(outputs, cfg, frames))
	}
	return result
}

// lint runs the linter, parses its JSON report into diagnostics and frames
// them as text on stdout. Exit code 0: clean, 1: findings.
func lint(ctx context.Context, spec processSpec, cfg Config, frames *frameWriter) Result {
	stdoutCapture := newStreamCapture(StreamStdout, cfg.MaxOutputBytes, frames)
	stderrCapture := newStreamCapture(StreamStderr, cfg.MaxOutputBytes, frames)
	lintReport := &cappedBuffer{limit: lintReportLimit}
	outcome := runProcess(ctx, spec, lintReport, stderrCapture)
	stderrCapture.finish()
	result := newResult(outcome, stdoutCapture, stderrCapture)
	if result.Error != nil || result.ExitCode == nil {
		return result
	}
	if *result.ExitCode > 1 {
		result.fail(fmt.Sprintf("the linter failed with exit status %d", *result.ExitCode))
		return result
	}
	if lintReport.Truncated() {
		result.fail(fmt.Sprintf("the linter's report exceeds %d bytes", lintReportLimit))
		return result
	}
	diagnostics, err := ParseRuffJSON(lintReport.data)
	if err != nil {
		result.fail(err.Error())
		return result
	}
	_, _ = io.WriteString(stdoutCapture, renderDiagnostics(cfg.SourceFile, diagnostics))
	stdoutCapture.finish()
	exitCode := 0
	if len(diagnostics) > 0 {
		exitCode = 1
	}
	result.ExitCode = &exitCode
	result.Diagnostics = diagnostics
	result.StdoutBytes = stdoutCapture.Total()
	result.StdoutTruncated = stdoutCapture.Truncated()
	return result
}

func newResult(outcome processOutcome, stdoutCapture, stderrCapture *streamCapture) Result {
	result := Result{
		ExitCode:        outcome.exitCode,
		Signal:          outcome.signal,
		TimedOut:        outcome.timedOut,
		DurationMs:      outcome.duration.Milliseconds(),
		StdoutBytes:     stdoutCapture.Total(),
		StderrBytes:     stderrCapture.Total(),
		StdoutTruncated: stdoutCapture.Truncated(),
		StderrTruncated: stderrCapture.Truncated(),
		PeakMemoryBytes: outcome.peakMemoryBytes,
	}
	if outcome.memoryExceeded {
		result.MemoryExceeded = true
		limit := int64(outcome.memoryLimit)
		result.MemoryLimitBytes = &limit
	}
	if outcome.startErr != nil {
		result.fail(outcome.startErr.Error())
		result.Signal = nil
		result.PeakMemoryBytes = nil
	}
	return result
}

func (r *Result) fail(message string) {
	r.Error = &message
	r.ExitCode = nil
}
