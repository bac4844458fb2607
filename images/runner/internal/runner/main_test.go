package runner

import (
	"os"
	"testing"
)

// runAsRunnerEnv makes the test binary behave as sandpod-runner, for tests
// that need the runner in its own process.
const runAsRunnerEnv = "SANDPOD_RUNNER_TEST_RUN_AS_RUNNER"

func TestMain(m *testing.M) {
	// The runner re-executes /proc/self/exe as the shim; under `go test` that
	// is this binary.
	if IsShimInvocation(os.Args) {
		ShimMain(os.Args[2:])
	}
	if os.Getenv(probeEnv) == "1" {
		runProbes()
	}
	if os.Getenv(runAsRunnerEnv) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
