// Command sandpod-runner runs one program inside a sandbox pod, as described
// in docs/runner-protocol.md.
package main

import (
	"os"

	"sandpod.dev/runner/internal/runner"
)

func main() {
	if runner.IsShimInvocation(os.Args) {
		runner.ShimMain(os.Args[2:])
	}
	os.Exit(runner.Main(os.Args[1:], os.Stdout, os.Stderr))
}
