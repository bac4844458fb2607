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

func TestServeModeRefusesACompileStep(t *testing.T) {
	served := newCompiledFixture(t, ``, copyingCompiler).config
	if err := checkNoCompileStep(served); err == nil {
		t.Error("a pre-started child cannot wait for a compile step")
	}
	served.CompileCommand = nil
	request := served
	request.CompileCommand = []string{"/bin/sh", "compile.sh"}
	if err := checkServable(served, request); err == nil {
		t.Error("a request with a compile step fits no pre-started child")
	}
}
