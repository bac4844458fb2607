package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// newCompiledFixture "compiles" main.src with a shell script standing in for
// a compiler: it writes ./main.sh, which the command then runs.
func newCompiledFixture(t *testing.T, source, compiler string) *fixture {
	t.Helper()
	f := newShellFixture(t, source)
	f.config.SourceFile = "main.src"
	f.inputFiles["file-0"] = compiler
	f.config.Files = []FileMapping{{Key: "file-0", Path: "compile.sh"}}
	f.config.CompileCommand = []string{"/bin/sh", "compile.sh"}
	f.config.CompileTimeoutSeconds = 10
	f.config.Command = []string{"/bin/sh", "main.sh"}
	return f
}

const copyingCompiler = `echo "compiling" ; echo "a warning" >&2 ; cp main.src main.sh`

func TestCompileStepRunsBeforeTheProgram(t *testing.T) {
	f := newCompiledFixture(t, `echo "hello from the program"`, copyingCompiler)
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "hello from the program\n" {
		t.Errorf("the program's stdout %q: the compiler's output must stay apart", got)
	}
	compiled := output.result.Compile
	if compiled == nil || compiled.ExitCode == nil || *compiled.ExitCode != 0 {
		t.Fatalf("compile result %+v", compiled)
	}
	if compiled.Output != "compiling\na warning\n" && compiled.Output != "a warning\ncompiling\n" {
		t.Errorf("compiler output %q", compiled.Output)
	}
	if compiled.OutputTruncated || compiled.TimedOut || compiled.Signal != nil {
		t.Errorf("compile result %+v", compiled)
	}
}

func TestAFailedCompileStepRunsNoProgram(t *testing.T) {
	f := newCompiledFixture(t, `touch ran`, `echo "main.src:1:1: syntax error" >&2; exit 2`)
	output := f.run(context.Background())

	result := output.result
	if result.ExitCode != nil || result.Signal != nil || result.Error != nil || result.TimedOut {
		t.Errorf("result %+v: the program must not have run", result)
	}
	if len(output.frames) != 0 {
		t.Errorf("frames %+v: the compiler's output is not the program's", output.frames)
	}
	compiled := result.Compile
	if compiled == nil || compiled.ExitCode == nil || *compiled.ExitCode != 2 {
		t.Fatalf("compile result %+v", compiled)
	}
	if compiled.Output != "main.src:1:1: syntax error\n" {
		t.Errorf("compiler output %q", compiled.Output)
	}
	if _, err := os.Stat(filepath.Join(f.opts.WorkDir, "ran")); err == nil {
		t.Error("the program ran after a failed compile")
	}
}

func TestTheBuildHasItsOwnTimeLimit(t *testing.T) {
	// Each step alone fits in the timeout, both together do not: the program
	// ends well only if its timeout starts when it does.
	f := newCompiledFixture(t, `sleep 1.5; echo done`, `cp main.src main.sh; sleep 1`)
	f.config.TimeoutSeconds = 2
	f.config.CompileTimeoutSeconds = 2
	output := f.run(context.Background())

	assertExit(t, output, intPtr(0), nil)
	if output.result.TimedOut || output.text(StreamStdout) != "done\n" {
		t.Errorf("result %+v: the build must not spend the program's timeout", output.result)
	}
}

// killedBuild is a compiler that outlives a compile time limit of a second.
func killedBuild(t *testing.T) *fixture {
	f := newCompiledFixture(t, `echo unreachable`, `echo working; sleep 30`)
	f.config.TimeoutSeconds = 30
	f.config.CompileTimeoutSeconds = 1
	return f
}

// assertBuildKilled checks the result of killedBuild's run: the compiler was
// killed at its limit, its output kept, and no program ran.
func assertBuildKilled(t *testing.T, output runnerOutput) {
	t.Helper()
	compiled := output.result.Compile
	if compiled == nil || !compiled.TimedOut || compiled.Signal == nil || *compiled.Signal != 9 {
		t.Fatalf("compile result %+v", compiled)
	}
	if compiled.DurationMs >= 10_000 {
		t.Errorf("the compiler ran %d ms: its limit is 1 s, not the program's 30", compiled.DurationMs)
	}
	if !output.result.TimedOut || output.result.ExitCode != nil || len(output.frames) != 0 {
		t.Errorf("result %+v, frames %+v", output.result, output.frames)
	}
	if compiled.Output != "working\n" {
		t.Errorf("compiler output %q", compiled.Output)
	}
}

func TestACompilerOverItsTimeLimitIsKilled(t *testing.T) {
	assertBuildKilled(t, killedBuild(t).run(context.Background()))
}

func TestCompilerOutputIsBounded(t *testing.T) {
	f := newCompiledFixture(t, `true`, `head -c 100000 /dev/zero | tr '\0' 'x'; exit 1`)
	output := f.run(context.Background())

	compiled := output.result.Compile
	if compiled == nil || len(compiled.Output) != compileOutputLimit || !compiled.OutputTruncated {
		t.Fatalf("compile output of %d bytes, truncated %v", len(compiled.Output), compiled.OutputTruncated)
	}
	message := TerminationMessage(output.summary)
	if len(message) > MaxTerminationMessageBytes || strings.Contains(string(message), "xxxx") {
		t.Errorf("termination message of %d bytes keeps the compiler's output", len(message))
	}
}

func TestAMissingCompilerIsTheRunnersError(t *testing.T) {
	f := newCompiledFixture(t, `true`, ``)
	f.config.CompileCommand = []string{"no-such-compiler"}
	output := f.run(context.Background())

	if output.result.Error == nil || !strings.Contains(*output.result.Error, "the compiler could not start") {
		t.Errorf("result %+v", output.result)
	}
}

func TestServeBuildsThenRunsTheProgram(t *testing.T) {
	f := newCompiledFixture(t, `read line; echo "hello from a pool, $line"`, copyingCompiler)
	stdin := "and stdin"
	f.stdin = &stdin
	output := f.decodeLog(f.serve().run("exec-1"))

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "hello from a pool, and stdin\n" {
		t.Errorf("the program's stdout %q: the compiler's output must stay apart", got)
	}
	compiled := output.result.Compile
	if compiled == nil || !compiled.succeeded() || !strings.Contains(compiled.Output, "compiling") {
		t.Fatalf("compile result %+v", compiled)
	}
}

func TestServeReportsAFailedBuildAndRunsNoProgram(t *testing.T) {
	f := newCompiledFixture(t, `touch ran`, `echo "main.src:1:1: syntax error" >&2; exit 2`)
	stdin := "never read"
	f.stdin = &stdin
	output := f.decodeLog(f.serve().run("exec-1"))

	if output.result.ExitCode != nil || output.result.Error != nil || len(output.frames) != 0 {
		t.Errorf("result %+v, frames %+v: the program must not have run", output.result, output.frames)
	}
	compiled := output.result.Compile
	if compiled == nil || compiled.ExitCode == nil || *compiled.ExitCode != 2 || compiled.Output != "main.src:1:1: syntax error\n" {
		t.Fatalf("compile result %+v", compiled)
	}
	if _, err := os.Stat(filepath.Join(f.opts.WorkDir, "ran")); err == nil {
		t.Error("the program ran after a failed compile")
	}
}

func TestServeKillsABuildAtItsTimeLimit(t *testing.T) {
	f := killedBuild(t)
	assertBuildKilled(t, f.decodeLog(f.serve().run("exec-1")))
}

func TestServeStartsNothingBeforeABuildsRequest(t *testing.T) {
	f := newCompiledFixture(t, `true`, copyingCompiler)
	f.serve()
	if pids := processesIn(t, f.opts.WorkDir); len(pids) != 0 {
		t.Errorf("processes %v wait in the work dir before any request", pids)
	}
}

func TestARunMustBuildAsTheServeConfigSays(t *testing.T) {
	f := newCompiledFixture(t, `true`, copyingCompiler)
	runner := f.serve()
	for _, compile := range [][]string{nil, {"/bin/sh", "other.sh"}} {
		request := f.config
		request.CompileCommand = compile
		served := runner.request("exec-1")
		config, err := json.Marshal(request)
		if err != nil {
			t.Fatal(err)
		}
		served.Config = config
		assertStatus(t, runner.post(served, runner.bearer()), http.StatusBadRequest)
	}
	if err := checkNoCompileStep(f.config); err == nil {
		t.Error("a session's runs cannot have a compile step")
	}
}

func TestACompileStepNeedsItsTimeLimit(t *testing.T) {
	cfg := newCompiledFixture(t, `true`, copyingCompiler).config
	cfg.CompileTimeoutSeconds = 0
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseConfig(data); err == nil || !strings.Contains(err.Error(), "compileTimeoutSeconds") {
		t.Errorf("a compile step without its time limit: %v", err)
	}
}
