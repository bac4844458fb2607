package runner

import (
	"context"
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

func TestCompileStepSpendsTheProgramsTimeout(t *testing.T) {
	// Each step alone fits in the timeout, both together do not: the program
	// times out only if the compile step spent part of its time.
	f := newCompiledFixture(t, `sleep 1.5`, `cp main.src main.sh; sleep 1`)
	f.config.TimeoutSeconds = 2
	output := f.run(context.Background())

	if !output.result.TimedOut || output.result.Compile == nil || output.result.Compile.TimedOut {
		t.Errorf("result %+v: the program, not the compiler, times out", output.result)
	}
}

func TestACompilerOverTheTimeoutIsKilled(t *testing.T) {
	f := newCompiledFixture(t, `echo unreachable`, `echo working; sleep 30`)
	f.config.TimeoutSeconds = 1
	output := f.run(context.Background())

	compiled := output.result.Compile
	if compiled == nil || !compiled.TimedOut || compiled.Signal == nil || *compiled.Signal != 9 {
		t.Fatalf("compile result %+v", compiled)
	}
	if !output.result.TimedOut || output.result.ExitCode != nil {
		t.Errorf("result %+v", output.result)
	}
	if compiled.Output != "working\n" {
		t.Errorf("compiler output %q", compiled.Output)
	}
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
	f := newCompiledFixture(t, `echo "hello from a pool"`, copyingCompiler)
	output := f.decodeLog(f.serve().run("exec-1"))

	assertExit(t, output, intPtr(0), nil)
	if got := output.text(StreamStdout); got != "hello from a pool\n" {
		t.Errorf("the program's stdout %q: the compiler's output must stay apart", got)
	}
	compiled := output.result.Compile
	if compiled == nil || compiled.ExitCode == nil || *compiled.ExitCode != 0 || !strings.Contains(compiled.Output, "compiling") {
		t.Fatalf("compile result %+v", compiled)
	}
}

func TestServeReportsAFailedBuildAndRunsNoProgram(t *testing.T) {
	f := newCompiledFixture(t, `touch ran`, `echo "main.src:1:1: syntax error" >&2; exit 2`)
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

func TestARunMustBuildAsThePreStartedChildWould(t *testing.T) {
	served := newCompiledFixture(t, ``, copyingCompiler).config
	if err := checkNoCompileStep(served); err == nil {
		t.Error("a session's runs cannot have a compile step")
	}
	if err := checkServable(served, served); err != nil {
		t.Errorf("the served config itself: %v", err)
	}
	for _, compile := range [][]string{nil, {"/bin/sh", "other.sh"}} {
		request := served
		request.CompileCommand = compile
		if err := checkServable(served, request); err == nil {
			t.Errorf("compileCommand %q fits a child pre-started for %q", compile, served.CompileCommand)
		}
	}
}
