package csharp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestClassicProgramsAndTextThatDoesNotSplitStayAsTheyAre(t *testing.T) {
	for name, source := range map[string]string{
		"a Main":                "using System;\nclass P {\n  static void Main() { Console.WriteLine(1); }\n}\n",
		"a Main in a namespace": "namespace N {\n  class P { public static int Main(string[] a) { return 0; } }\n}\n",
		"types only":            "class A {}\nstruct B {}\n",
		"an open brace":         "Console.WriteLine(1);\nif (true) {\n",
		"an open string":        "Console.WriteLine(\"1);\n",
		"an open comment":       "Console.WriteLine(1); /* ...\n",
	} {
		t.Run(name, func(t *testing.T) {
			got, changed := Wrap(source, "main.cs")
			if changed || got != source {
				t.Fatalf("changed=%v, got:\n%s", changed, got)
			}
		})
	}
}

func TestStatementsAreWrappedWithUsingsOnTopAndTypesAfter(t *testing.T) {
	source := "using System.Text;\n// a comment with class X { and \"\n" +
		"var sb = new StringBuilder($\"{\"}\"}{{\");\n" +
		"Console.WriteLine(sb);\n" +
		"class Point { public int X; }\n"
	got, changed := Wrap(source, "main.cs")
	if !changed {
		t.Fatal("not wrapped")
	}
	using := strings.Index(got, "using System.Text;")
	implicit := strings.Index(got, "using System.Linq;")
	main := strings.Index(got, "static void Main(string[] args) {")
	statement := strings.Index(got, "#line 3 \"main.cs\"\nvar sb = new StringBuilder($\"{\"}\"}{{\");")
	point := strings.Index(got, "#line 5 \"main.cs\"\nclass Point")
	if using < 0 || implicit < using || main < implicit || statement < main || point < statement {
		t.Fatalf("out of order (%d %d %d %d %d):\n%s", using, implicit, main, statement, point, got)
	}
	if strings.Count(got, "using System.Text;") != 1 {
		t.Fatalf("a using twice:\n%s", got)
	}
}

func TestMainShapeFollowsAwaitAndReturn(t *testing.T) {
	cases := map[string]struct{ source, want string }{
		"plain":  {"Console.WriteLine(1);\n", "static void Main(string[] args) {"},
		"return": {"if (args.Length > 0) return 3;\nreturn 0;\n", "static int Main(string[] args) {"},
		"await":  {"await Task.Delay(1);\n", "static async System.Threading.Tasks.Task SandpodTopLevel"},
		"both":   {"await Task.Delay(1);\nreturn 2;\n", "Task<int> SandpodTopLevel"},
		// A return inside a top-level function does not make Main return a value.
		"function": {"int Two() { return 2; }\nConsole.WriteLine(Two());\n", "static void Main(string[] args) {"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, changed := Wrap(c.source, "main.cs")
			if !changed || !strings.Contains(got, c.want) {
				t.Fatalf("want %q in:\n%s", c.want, got)
			}
		})
	}
}

func TestTopLevelFunctionsBecomeStaticMethods(t *testing.T) {
	got, _ := Wrap("Console.WriteLine(Twice(2));\nint Twice(int x) => x * 2;\nstatic int Once(int x) { return x; }\n", "main.cs")
	if !strings.Contains(got, "static\n#line 2 \"main.cs\"\nint Twice(int x) => x * 2;") ||
		!strings.Contains(got, "#line 3 \"main.cs\"\nstatic int Once") || strings.Contains(got, "static\n#line 3") {
		t.Fatalf("functions:\n%s", got)
	}
	if strings.Index(got, "int Twice") > strings.Index(got, "static void Main") {
		t.Fatalf("a function inside Main:\n%s", got)
	}
}

func TestIndentationKeepsColumns(t *testing.T) {
	got, _ := Wrap("int a = 1;\n\t  Console.WriteLine(a);\n", "main.cs")
	if !strings.Contains(got, "#line 2 \"main.cs\"\n\t  Console.WriteLine(a);") {
		t.Fatalf("indentation lost:\n%s", got)
	}
}

// With Mono's compiler on PATH (Debian's mono-mcs, as in the csharp image): what Main
// writes builds and runs, and compile errors name the user's file, lines and columns.
func TestMonoBuildsWhatMainWrites(t *testing.T) {
	for _, tool := range []string{"mcs", "mono"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (hack/mono.sh installs it)", tool)
		}
	}
	cases := []struct {
		name, source, stdout, compileOutput string
		exitCode                            int
	}{
		{"hello", "Console.WriteLine(\"hi\");\n", "hi\n", "", 0},
		{"classic", "class P { static void Main() { System.Console.WriteLine(\"classic\"); } }\n", "classic\n", "", 0},
		{"everything", "using static System.Math;\n\nvar xs = new List<int> { 3, 1, 2 };\n" +
			"Console.WriteLine($\"{Twice(xs.Max())} {Max(1, 2)} {new Point { X = 5 }.X}\");\n" +
			"await Task.Delay(1);\nif (args.Length == 0) return 4;\nreturn 0;\n" +
			"int Twice(int x) => x * 2;\nclass Point { public int X; }\n", "6 2 5\n", "", 4},
		{"error", "Console.WriteLine(1);\n  int x = \"s\";\n", "", "main.cs(2,11): error CS0029", 1},
		{"classic error", "class P {\n  static void Main() { int x = \"s\"; }\n}\n", "", "main.cs(2,32): error CS0029", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "main.cs"), []byte(c.source), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Chdir(dir)
			if status := Main("main.cs", "out.cs", os.Stderr); status != 0 {
				t.Fatalf("Main: %d", status)
			}
			built, err := exec.Command("mcs", "-nologo", "-langversion:7.2", "-out:main.exe", "out.cs").CombinedOutput()
			if c.compileOutput != "" {
				if err == nil || !strings.Contains(string(built), c.compileOutput) {
					t.Fatalf("want %q from mcs, got %v:\n%s", c.compileOutput, err, built)
				}
				return
			}
			if err != nil {
				t.Fatalf("mcs: %v\n%s", err, built)
			}
			run := exec.Command("mono", "main.exe")
			stdout, _ := run.Output()
			if string(stdout) != c.stdout || run.ProcessState.ExitCode() != c.exitCode {
				t.Fatalf("stdout %q, exit %d", stdout, run.ProcessState.ExitCode())
			}
		})
	}
}
