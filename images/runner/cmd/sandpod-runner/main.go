// Command sandpod-runner runs one program inside a sandbox pod, as described
// in docs/runner-protocol.md. `sandpod-runner csharp-toplevel IN OUT` instead
// prepares a C# program for Mono's compiler (package csharp).
package main

import (
	"os"

	"sandpod.dev/runner/internal/csharp"
	"sandpod.dev/runner/internal/runner"
)

func main() {
	if runner.IsShimInvocation(os.Args) {
		runner.ShimMain(os.Args[2:])
	}
	if len(os.Args) == 4 && os.Args[1] == csharp.Command {
		os.Exit(csharp.Main(os.Args[2], os.Args[3], os.Stderr))
	}
	os.Exit(runner.Main(os.Args[1:], os.Stdout, os.Stderr))
}
