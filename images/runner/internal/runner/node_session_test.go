package runner

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// nodeKernelEnv points the runner a test starts at the node kernel.
const nodeKernelEnv = "SANDPOD_RUNNER_TEST_NODE_KERNEL"

// repositoryNodeKernel is the kernel the node image ships, in the repository.
var repositoryNodeKernel, _ = filepath.Abs("../../../node/kernel.mjs")

// testNode is a node of version 24 or newer, the node image's: $SANDPOD_TEST_NODE
// or node on PATH; the tests that need one skip without it.
func testNode(t *testing.T) string {
	t.Helper()
	node := os.Getenv("SANDPOD_TEST_NODE")
	if node == "" {
		node = "node"
	}
	version, err := exec.Command(node, "--version").Output()
	major, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(string(version)), "v"), ".")
	if number, _ := strconv.Atoi(major); err != nil || number < 24 {
		t.Skipf("no node 24 or newer (SANDPOD_TEST_NODE=%q, node --version %q)", os.Getenv("SANDPOD_TEST_NODE"), version)
	}
	return node
}

// newNodeSession serves a session of sourceFile (main.js or main.ts) in the
// node kernel. The kernel finds acorn (static imports) in its node_modules in
// the image; here in $SANDPOD_TEST_NODE_PATH, if set.
func newNodeSession(t *testing.T, sourceFile string) *servingRunner {
	f := newPythonFixture(t, "")
	f.config.SourceFile = sourceFile
	f.config.Command = []string{testNode(t), sourceFile}
	f.config.Env = map[string]string{}
	if modules := os.Getenv("SANDPOD_TEST_NODE_PATH"); modules != "" {
		f.config.Env["NODE_PATH"] = modules
	}
	return f.serve("--session")
}

func TestNodeSessionKeepsVariablesFunctionsAndReturnsTheCompletionValue(t *testing.T) {
	s := newNodeSession(t, "main.js")
	first := s.runCode("exec-1", "let x = 41\nconst double = (n) => 2 * n\nfunction greet(name) { return `hi ${name}` }\nconsole.log('one')")
	assertRun(t, first, 0, "one\n", "", false)
	assertValue(t, first, nil)
	second := s.runCode("exec-2", "console.log(greet('you'))\nx + 1")
	assertRun(t, second, 0, "hi you\n", "", false)
	assertValue(t, second, strPtr("42"))
	if !*second.result.Kernel {
		t.Error("a node session run is not reported as the kernel's")
	}
	for source, want := range map[string]*string{
		"'a'.repeat(2)":       strPtr("'aa'"),
		"({k: [1, 2]})":       strPtr("{ k: [ 1, 2 ] }"),
		"undefined":           nil,
		"null":                strPtr("null"),
		"let unused = 1":      nil,
		"double(x)":           strPtr("82"),
		"10n ** 20n":          strPtr("100000000000000000000n"),
		"-0":                  strPtr("-0"),
		"[NaN, Infinity]":     strPtr("[ NaN, Infinity ]"),
		"new Map([[1, 'a']])": strPtr("Map(1) { 1 => 'a' }"),
	} {
		assertValue(t, s.runCode("exec-"+source, source), want)
	}
}

func TestNodeSessionRedeclaresLetAndConstAndAwaitsAtTopLevel(t *testing.T) {
	s := newNodeSession(t, "main.js")
	assertRun(t, s.runCode("exec-1", "let a = 1\nconst b = 2"), 0, "", "", false)
	again := s.runCode("exec-2", "let a = 10\nconst b = 20\nconst c = await new Promise((resolve) => setTimeout(() => resolve(a + b), 20))\nc")
	assertQuietValue(t, again, strPtr("30"))
	assertValue(t, s.runCode("exec-3", "c * 2"), strPtr("60"))
}

func TestNodeSessionKeepsImports(t *testing.T) {
	if os.Getenv("SANDPOD_TEST_NODE_PATH") == "" {
		t.Skip("static imports need acorn: set SANDPOD_TEST_NODE_PATH to a node_modules holding it")
	}
	s := newNodeSession(t, "main.js")
	work := s.f.opts.WorkDir
	if err := os.WriteFile(filepath.Join(work, "local.mjs"), []byte("export const w = 3\nexport default 'd'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	imported := s.runCode("exec-1", "import os from 'node:os'\nimport { join as j } from 'path'\nimport * as fs from 'fs'\nimport d, { w } from './local.mjs'\nconst util = await import('node:util')")
	assertRun(t, imported, 0, "", "", false)
	used := s.runCode("exec-2", "[typeof os.cpus, j('a', 'b'), typeof fs.readFileSync, d, w, typeof util.inspect, typeof require('node:path').join].join(' ')")
	assertQuietValue(t, used, strPtr("'function a/b function d 3 function function'"))
}

func TestNodeSessionPrintsErrorsAndKeepsTheState(t *testing.T) {
	s := newNodeSession(t, "main.js")
	assertRun(t, s.runCode("exec-1", "let kept = 5\nfunction f() { throw new Error('boom') }\nf()"), 1, "",
		"Uncaught Error: boom\n    at f (cell-1:2:22)\n    at cell-1:3:1\n", false)
	syntax := s.runCode("exec-2", "kept = ")
	assertExit(t, syntax, intPtr(1), nil)
	if stderr := syntax.text(StreamStderr); !strings.HasPrefix(stderr, "Uncaught SyntaxError: Unexpected end of input") {
		t.Errorf("syntax error printed as %q", stderr)
	}
	assertRun(t, s.runCode("exec-3", "process.exitCode = 4\nkept += 1"), 4, "", "", false)
	later := s.runCode("exec-4", "setTimeout(() => { throw new Error('later') }, 0)\nawait new Promise((resolve) => setTimeout(resolve, 50))\nkept")
	assertExit(t, later, intPtr(0), nil)
	assertValue(t, later, strPtr("6"))
	if stderr := later.text(StreamStderr); !strings.HasPrefix(stderr, "Uncaught Error: later") {
		t.Errorf("an error in a callback printed as %q", stderr)
	}
}

func TestNodeSessionStripsTypeScriptTypes(t *testing.T) {
	s := newNodeSession(t, "main.ts")
	assertRun(t, s.runCode("exec-1", "enum Color { Red = 4 }\ninterface P { n: number }\nconst p: P = { n: Color.Red }\nconsole.log(p.n)"), 0, "4\n", "", false)
	typed := s.runCode("exec-2", "const p: P = { n: 5 }\nconst twice = (v: number): number => v * 2\ntwice(p.n) as number")
	assertQuietValue(t, typed, strPtr("10"))
	broken := s.runCode("exec-3", "let y: = 1")
	assertExit(t, broken, intPtr(1), nil)
	if stderr := broken.text(StreamStderr); !strings.Contains(stderr, "ERR_INVALID_TYPESCRIPT_SYNTAX") {
		t.Errorf("a TypeScript syntax error printed as %q", stderr)
	}
}

func TestNodeSessionTimeoutAndExitLoseTheState(t *testing.T) {
	s := newNodeSession(t, "main.js")
	assertRun(t, s.runCode("exec-1", "let x = 1"), 0, "", "", false)
	s.f.config.TimeoutSeconds = 1
	timedOut := s.runCode("exec-2", "console.log('started')\nwhile (true) {}")
	assertExit(t, timedOut, nil, intPtr(9))
	if !timedOut.result.TimedOut || !timedOut.stateLost() || timedOut.text(StreamStdout) != "started\n" {
		t.Errorf("timed out run: %+v, stdout %q", timedOut.summary, timedOut.text(StreamStdout))
	}
	s.f.config.TimeoutSeconds = 10
	next := s.runCode("exec-3", "console.log('ok')\ntypeof x")
	assertRun(t, next, 0, "ok\n", "", true)
	assertValue(t, next, strPtr("'undefined'"))
	assertRun(t, s.runCode("exec-4", "let x = 2"), 0, "", "", false)
	exited := s.runCode("exec-5", "console.log('bye')\nprocess.exit(7)")
	assertRun(t, exited, 7, "bye\n", "", true)
	assertValue(t, s.runCode("exec-6", "typeof x"), strPtr("'undefined'"))
}

func TestNodeSessionOutputOfOneRunStaysInIt(t *testing.T) {
	s := newNodeSession(t, "main.js")
	big := s.runCode("exec-1", "process.stdout.write('x'.repeat(300000))\nconsole.error('err')")
	if stdout := big.text(StreamStdout); len(stdout) != 300000 || strings.Trim(stdout, "x") != "" {
		t.Errorf("stdout of %d bytes", len(stdout))
	}
	assertExit(t, big, intPtr(0), nil)
	if big.text(StreamStderr) != "err\n" {
		t.Errorf("stderr %q", big.text(StreamStderr))
	}
	assertRun(t, s.runCode("exec-2", "console.log('second')"), 0, "second\n", "", false)
}

func TestNodeSessionCancelInterruptsAnAwaitAndKeepsTheState(t *testing.T) {
	s := newNodeSession(t, "main.js")
	assertRun(t, s.runCode("exec-1", "let x = 1"), 0, "", "", false)
	cancelled := s.startAndCancel("exec-2", "console.log('started')\nx += 1\nawait new Promise(() => {})")
	assertExit(t, cancelled, intPtr(1), nil)
	if !cancelled.result.Cancelled || *cancelled.result.StateLost ||
		!strings.Contains(cancelled.text(StreamStderr), "interrupted by `SIGINT`") {
		t.Errorf("cancelled await: %+v, stderr %q", cancelled.summary, cancelled.text(StreamStderr))
	}
	assertValue(t, s.runCode("exec-3", "x"), strPtr("2"))
	busy := s.startAndCancel("exec-4", "console.log('busy')\nwhile (true) {}")
	if !busy.result.Cancelled || !*busy.result.StateLost {
		t.Errorf("cancelled busy loop: %+v", busy.summary)
	}
}

func TestNodeSessionNeedsTheKernelAndAFileCommand(t *testing.T) {
	kernel := nodeKernelPath
	t.Cleanup(func() { nodeKernelPath = kernel })
	nodeKernelPath = repositoryNodeKernel
	for command, want := range map[string]bool{
		"node main.js": true,
		"/usr/local/bin/node --experimental-transform-types main.ts": true,
		"node main.py":           false,
		"node script.js main.js": false,
		"deno main.js":           false,
	} {
		argv := strings.Fields(command)
		if got := usesNodeKernel(Config{Command: argv, SourceFile: argv[len(argv)-1]}); got != want {
			t.Errorf("%q: node kernel %v, want %v", command, got, want)
		}
	}
	typescript := Config{Command: []string{"node", "--experimental-transform-types", "--disable-warning=ExperimentalWarning", "main.ts"}, SourceFile: "main.ts"}
	if argv := nodeKernelArgv(typescript); !slices.Equal(argv, []string{"node", "--experimental-transform-types", "--disable-warning=ExperimentalWarning", repositoryNodeKernel, "main.ts"}) {
		t.Errorf("the kernel's argv for typescript: %q", argv)
	}
	nodeKernelPath = filepath.Join(t.TempDir(), "absent.mjs")
	if usesNodeKernel(Config{Command: []string{"node", "main.js"}, SourceFile: "main.js"}) {
		t.Error("a node image without the kernel runs sessions in it")
	}
}

func TestMarkedOutputKeepsWhatLiesBetweenTheRunsMarksWhateverTheReads(t *testing.T) {
	mark := newRunMark()
	stream := "before\x00" + mark[:5] + mark + "run's \x00 output" + mark + "after"
	for size := 1; size <= len(stream); size++ {
		output := &markedOutput{ended: make(chan struct{})}
		var got strings.Builder
		output.begin(mark, &got)
		for start := 0; start < len(stream); start += size {
			_, _ = output.Write([]byte(stream[start:min(start+size, len(stream))]))
		}
		output.finish(0)
		if got.String() != "run's \x00 output" {
			t.Fatalf("reads of %d bytes: %q", size, got.String())
		}
	}
}
