package csharp

import (
	"fmt"
	"io"
	"os"
)

// Command is the runner's argument that runs Main instead of a program:
// `sandpod-runner csharp-toplevel main.cs out.cs` (the catalog's compile step for csharp).
const Command = "csharp-toplevel"

// Main writes to outPath what mcs should compile for the program in sourcePath: the program
// wrapped, or as it was; either way starting with a #line directive naming sourcePath, so
// that the compiler's messages name the user's file and lines. It returns the exit status.
func Main(sourcePath, outPath string, stderr io.Writer) int {
	source, err := os.ReadFile(sourcePath)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Command, err)
		return 1
	}
	wrapped, changed := Wrap(string(source), sourcePath)
	if !changed {
		wrapped = fmt.Sprintf("#line 1 %q\n%s", sourcePath, wrapped)
	}
	if err := os.WriteFile(outPath, []byte(wrapped), 0o600); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", Command, err)
		return 1
	}
	return 0
}
