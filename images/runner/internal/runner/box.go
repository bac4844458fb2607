package runner

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A box is one run's own view of the sandbox's writable places, for a
// sandbox that serves many runs (serve mode with maxRuns above 1): the shim
// enters new user, mount and IPC namespaces, mounts the box's own directory
// over the scratch root (so the work dir, home, TMPDIR and the outputs dir
// are all the box's), the box's own shm directory over /dev/shm (beside the
// root, on the scratch filesystem: its bytes count as the run's memory) and
// /dev/null over the termination log, changes to its work dir and drops the one capability it
// mounted with; only then does it take on the program's limits and filter
// (which refuses mounts and namespaces). The user namespace has no ID map
// (gVisor lets an unprivileged process create one only without), so the
// program sees itself as the overflow user; the sandbox still sees the
// sandbox user, who owns what the run writes.
type box struct {
	// root is the box's directory as the runner sees it; root+shmSuffix its
	// /dev/shm.
	root string
	// scratch is the directory the box's root is mounted over.
	scratch string
	// workDir is the program's work dir, under scratch.
	workDir string
}

const (
	boxesDirName = ".boxes"
	shmSuffix    = ".shm"
	// terminationLog is where the kubelet reads a container's termination
	// message: the runner's summary, never a run's.
	terminationLog = "/dev/termination-log"

	capSysAdmin          = 21
	prCapAmbient         = 47
	prCapAmbientClearAll = 4
)

// namespaces has the shim start in the box's new namespaces, allowed to mount.
func (b *box) namespaces(attr *syscall.SysProcAttr) {
	attr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC
	attr.AmbientCaps = []uintptr{capSysAdmin}
}

// outside is path (under scratch, as the program sees it) as the runner sees it.
func (b *box) outside(path string) string {
	rel, err := filepath.Rel(b.scratch, path)
	if err != nil || !filepath.IsLocal(rel) {
		return b.root
	}
	return filepath.Join(b.root, rel)
}

// enterBox makes the shim's process the box's (see box).
func enterBox(b box) error {
	mounts := []struct {
		source, target, fstype string
		flags                  uintptr
		data                   string
	}{
		{"", "/", "", syscall.MS_REC | syscall.MS_PRIVATE, ""},
		// Before the root hides where it lies.
		{b.root + shmSuffix, "/dev/shm", "", syscall.MS_BIND, ""},
		{b.root, b.scratch, "", syscall.MS_BIND | syscall.MS_REC, ""},
	}
	if _, err := os.Stat(terminationLog); err == nil {
		mounts = append(mounts, struct {
			source, target, fstype string
			flags                  uintptr
			data                   string
		}{os.DevNull, terminationLog, "", syscall.MS_BIND, ""})
	}
	for _, m := range mounts {
		if err := syscall.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("entering the run's box: mounting %s: %w", m.target, err)
		}
	}
	if err := syscall.Chdir(b.workDir); err != nil {
		return fmt.Errorf("entering the run's box: %w", err)
	}
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientClearAll, 0, 0, 0, 0); errno != 0 {
		return fmt.Errorf("entering the run's box: dropping the mount capability: %w", errno)
	}
	return nil
}

// boxedRuns is serve mode's executor for a sandbox that serves many runs,
// one at a time, each in a fresh box, its program pre-started there while
// no run is in progress. After each run everything of it goes (as PID 1 the
// runner kills every other process; the box's directory is removed) and the
// runner checks that nothing is left. A run that left something, or that
// used up the served config's maxRuns or maxAgeSeconds, retires the sandbox:
// its result says retiring, and the runner takes no further run.
type boxedRuns struct {
	served  Config
	opts    Options
	started time.Time

	// mu is held by a run and by the preparation of the next box.
	mu      sync.Mutex
	next    *warmChild
	nextBox *box
	made    int
	runs    int
	// retiring is read without mu, by a claim while the next box is prepared.
	retiring atomic.Bool
	// problems gets why a run retired the sandbox (the runner's stderr).
	problems func(error)
}

func newBoxedRuns(served Config, opts Options, problems func(error)) (*boxedRuns, error) {
	b := &boxedRuns{served: served, opts: opts, started: time.Now(), problems: problems}
	if err := os.MkdirAll(b.boxesDir(), 0o755); err != nil {
		return nil, fmt.Errorf("creating the boxes' directory: %w", err)
	}
	return b, b.prepare()
}

func (b *boxedRuns) boxesDir() string {
	return filepath.Join(filepath.Dir(b.opts.WorkDir), boxesDirName)
}

// prepare makes the next box and pre-starts its program.
func (b *boxedRuns) prepare() error {
	b.made++
	inBox := &box{
		root:    filepath.Join(b.boxesDir(), strconv.Itoa(b.made)),
		scratch: filepath.Dir(b.opts.WorkDir),
		workDir: b.opts.WorkDir,
	}
	for _, dir := range []string{inBox.root, inBox.root + shmSuffix} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("creating the run's box: %w", err)
		}
	}
	boxOpts := b.opts
	boxOpts.WorkDir = inBox.outside(b.opts.WorkDir)
	child, err := prestart(b.served, boxOpts, inBox)
	if err != nil {
		return err
	}
	b.next, b.nextBox = child, inBox
	return nil
}

// prepareNext pre-starts the next run's program unless a run did already.
func (b *boxedRuns) prepareNext() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next != nil || b.retiring.Load() {
		return
	}
	// A failure shows in the next run, which tries again.
	if err := b.prepare(); err != nil {
		b.problems(err)
	}
}

// accepting says why no further run is taken, or nil.
func (b *boxedRuns) accepting() error {
	if b.retiring.Load() || b.pastAge() {
		return errRetired
	}
	return nil
}

var errRetired = errors.New("this sandbox is retired: it takes no further run")

func (b *boxedRuns) pastAge() bool {
	age := time.Duration(b.served.MaxAgeSeconds) * time.Second
	return age > 0 && time.Since(b.started) >= age
}

func (b *boxedRuns) run(ctx context.Context, cfg Config, request runRequest, frames *frameWriter) Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.next == nil {
		if err := b.prepare(); err != nil {
			b.retiring.Store(true)
			result := failedResult(err)
			result.Retiring = true
			return result
		}
	}
	child, inBox := b.next, b.nextBox
	b.next, b.nextBox = nil, nil
	result := child.run(ctx, cfg, request, frames)
	b.runs++
	if err := b.clear(inBox); err != nil {
		b.retiring.Store(true)
		b.problems(err)
	}
	if b.runs >= b.served.MaxRuns || b.pastAge() {
		b.retiring.Store(true)
	}
	result.Retiring = b.retiring.Load()
	if !result.Retiring {
		go b.prepareNext()
	}
	return result
}

// clear removes the run's box and says what of the run is left, if anything:
// a process (as PID 1, where every other process is a run's), anything in
// the scratch root but the boxes' directory, or anything in that.
func (b *boxedRuns) clear(inBox *box) error {
	for _, dir := range []string{inBox.root, inBox.root + shmSuffix} {
		if err := removeTree(dir); err != nil {
			return fmt.Errorf("removing the run's box: %w", err)
		}
	}
	// As PID 1, kill(-1, 0) finds any process but the runner.
	if os.Getpid() == 1 && !errors.Is(syscall.Kill(-1, 0), syscall.ESRCH) {
		return errors.New("processes of the run are left")
	}
	for dir, allowed := range map[string][]string{inBox.scratch: {boxesDirName}, b.boxesDir(): nil} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("checking %s: %w", dir, err)
		}
		for _, entry := range entries {
			if !slices.Contains(allowed, entry.Name()) {
				return fmt.Errorf("the run left %s", filepath.Join(dir, entry.Name()))
			}
		}
	}
	return nil
}

// close kills the pre-started program of the next run, if any.
func (b *boxedRuns) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retiring.Store(true)
	if b.next != nil {
		b.next.close()
		b.next = nil
	}
}

// removeTree removes root and everything in it, first giving back to every
// directory the permissions a run may have taken from it (the runner owns
// what a run writes). Symlinks are removed, never followed.
func removeTree(root string) error {
	_ = filepath.WalkDir(root, func(path string, entry fs.DirEntry, err error) error {
		if err == nil && entry.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	return os.RemoveAll(root)
}
