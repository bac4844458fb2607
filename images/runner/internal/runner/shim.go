package runner

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// shimMarker is the hidden first argument with which the runner re-executes
// itself as the program's process: the shim sets the rlimits and installs the
// seccomp filter in that process only, then replaces itself with the program.
const shimMarker = "__sandpod_exec__"

// The shim's error pipe receives the reason it could not start the program.
// It is close-on-exec, so the runner reads EOF and nothing else when exec
// succeeds. It is the descriptor after the extra files: fd 3 in one-off
// mode, fd 4 in serve mode, where fd 3 is the release socket, and for a
// one-off python program, where fd 3 is the bootstrap's value channel.
const (
	shimErrorFD        = 3
	shimServeErrorFD   = 4
	shimReleaseFD      = 3
	shimReleaseMaxArgv = 1 << 20
)

// Shim modes: shimRun execs the program at once; shimWait (serve mode, and
// one-off python) applies the limits and the filter, then, if it was given no
// program, says it is ready on the release socket and execs the argv read
// from it, or else execs the given program (the python bootstrap, which
// waits on the socket itself or, one-off, reports on the value channel).
const (
	shimRun  = "run"
	shimWait = "wait"
)

const shimExitCode = 127

// IsShimInvocation reports whether args (os.Args) ask for the shim.
func IsShimInvocation(args []string) bool {
	return len(args) > 1 && args[1] == shimMarker
}

// shimArgv passes the limits, the filter's target and the box to enter (nil:
// none); a zero guard pid installs no filter (only tests measuring the
// filter's cost ask for that).
func shimArgv(selfExe string, limits Limits, guard guardTarget, mode string, inBox *box, argv []string) []string {
	var boxArgs [3]string
	if inBox != nil {
		boxArgs = [3]string{inBox.root, inBox.scratch, inBox.workDir}
	}
	return append([]string{
		selfExe,
		shimMarker,
		strconv.FormatUint(limits.Processes, 10),
		strconv.FormatUint(limits.FileSizeBytes, 10),
		strconv.FormatUint(limits.OpenFiles, 10),
		strconv.Itoa(guard.Pid),
		strconv.Itoa(guard.Pgid),
		mode,
		boxArgs[0], boxArgs[1], boxArgs[2],
		"--",
	}, argv...)
}

// ShimMain runs in the freshly started program process with the arguments that
// follow shimMarker: it applies the limits and execs the program. It returns
// only by exiting.
func ShimMain(args []string) {
	errorFD := shimErrorFD
	if len(args) > 5 && args[5] == shimWait {
		errorFD = shimServeErrorFD
	}
	syscall.CloseOnExec(errorFD)
	errorPipe := os.NewFile(uintptr(errorFD), "shim-error")
	err := execWithLimits(args)
	_, _ = fmt.Fprint(errorPipe, err.Error())
	os.Exit(shimExitCode)
}

func execWithLimits(args []string) error {
	if len(args) < 10 || args[9] != "--" || (args[5] != shimRun && args[5] != shimWait) {
		return fmt.Errorf("malformed shim arguments %q", args)
	}
	var values [5]uint64
	for i := range values {
		value, err := strconv.ParseUint(args[i], 10, 64)
		if err != nil {
			return fmt.Errorf("malformed shim argument %q", args[i])
		}
		values[i] = value
	}
	processes, fileSize, openFiles := values[0], values[1], values[2]
	guard := guardTarget{Pid: int(values[3]), Pgid: int(values[4])}
	mode, argv := args[5], args[10:]
	if mode == shimRun && len(argv) == 0 {
		return fmt.Errorf("malformed shim arguments %q", args)
	}
	if args[6] != "" {
		if err := enterBox(box{root: args[6], scratch: args[7], workDir: args[8]}); err != nil {
			return err
		}
	}
	if err := applyLimits(processes, fileSize, openFiles, guard); err != nil {
		return err
	}
	if len(argv) == 0 {
		var err error
		if argv, err = awaitRelease(); err != nil {
			return err
		}
	}
	// The environment is already the program's, so PATH lookup uses its PATH.
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("cannot start %q: %w", argv[0], err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	return fmt.Errorf("cannot start %q: %w", argv[0], err)
}

// applyLimits sets the rlimits and installs the seccomp filter in this process.
func applyLimits(processes, fileSize, openFiles uint64, guard guardTarget) error {
	if err := setHardLimit(syscall.RLIMIT_CORE, 0); err != nil {
		return err
	}
	if err := setHardLimit(syscall.RLIMIT_FSIZE, fileSize); err != nil {
		return err
	}
	if err := setHardLimit(syscall.RLIMIT_NOFILE, openFiles); err != nil {
		return err
	}
	// Last: a low process limit could keep the Go runtime from starting threads.
	if err := setHardLimit(rlimitNproc, processes); err != nil {
		return err
	}
	// Last of all: the filter also applies to the shim's remaining steps.
	if guard.Pid != 0 {
		filter, err := buildSeccompFilter(seccompRules(guard))
		if err != nil {
			return err
		}
		return installSeccompFilter(filter)
	}
	return nil
}

// awaitRelease says the shim is ready on the release socket and reads the
// program's argv from it: NUL-separated, up to the runner's end of writing.
func awaitRelease() ([]string, error) {
	release := os.NewFile(shimReleaseFD, "release")
	defer release.Close()
	if _, err := release.Write([]byte{releaseReady}); err != nil {
		return nil, fmt.Errorf("signalling readiness: %w", err)
	}
	request, err := io.ReadAll(io.LimitReader(release, shimReleaseMaxArgv))
	if err != nil {
		return nil, fmt.Errorf("reading the release: %w", err)
	}
	argv := strings.Split(string(request), "\x00")
	if len(request) == 0 || argv[0] == "" {
		return nil, errors.New("released without a command")
	}
	return argv, nil
}

// rlimitNproc is RLIMIT_NPROC, which package syscall does not name on Linux;
// it is 6 on amd64 and arm64, the architectures the images are built for.
const rlimitNproc = 6

// setHardLimit sets both the soft and the hard limit, so the program cannot
// raise it again. Zero leaves the limit alone, except for RLIMIT_CORE where
// zero is the point; a limit is never raised above the inherited hard limit.
func setHardLimit(resource int, value uint64) error {
	if value == 0 && resource != syscall.RLIMIT_CORE {
		return nil
	}
	var current syscall.Rlimit
	if err := syscall.Getrlimit(resource, &current); err != nil {
		return fmt.Errorf("getrlimit(%s): %w", rlimitName(resource), err)
	}
	value = min(value, current.Max)
	if err := syscall.Setrlimit(resource, &syscall.Rlimit{Cur: value, Max: value}); err != nil {
		return fmt.Errorf("setrlimit(%s, %d): %w", rlimitName(resource), value, err)
	}
	return nil
}

func rlimitName(resource int) string {
	switch resource {
	case syscall.RLIMIT_CORE:
		return "RLIMIT_CORE"
	case syscall.RLIMIT_FSIZE:
		return "RLIMIT_FSIZE"
	case syscall.RLIMIT_NOFILE:
		return "RLIMIT_NOFILE"
	case rlimitNproc:
		return "RLIMIT_NPROC"
	default:
		return strconv.Itoa(resource)
	}
}
