package runner

import (
	"os"
	"testing"
	"time"
)

// runAsRunnerEnv makes the test binary behave as sandpod-runner, for tests
// that need the runner in its own process.
const runAsRunnerEnv = "SANDPOD_RUNNER_TEST_RUN_AS_RUNNER"

// withoutGraceEnv makes that runner wait an hour, not seconds, for output and
// reaping once the program ends: a process it failed to kill then keeps the
// run from ending, which its test sees, with no bound on time to assert.
const withoutGraceEnv = "SANDPOD_RUNNER_TEST_WITHOUT_GRACE"

// stretchGraces sets the grace periods to an hour.
func stretchGraces() {
	drainGrace, reapGrace = time.Hour, time.Hour
}

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
		if os.Getenv(withoutGraceEnv) == "1" {
			stretchGraces()
		}
		if kernel := os.Getenv(nodeKernelEnv); kernel != "" {
			nodeKernelPath = kernel
		}
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
