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
	// userNamespace names the box's user namespace (its processes' ns/user
	// link), once its program is started: what tells the box's processes.
	userNamespace string
}

// members lists the box's processes.
func (b *box) members() []int {
	var members []int
	for _, pid := range processes() {
		if ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user"); err == nil && ns == b.userNamespace {
			members = append(members, pid)
		}
	}
	return members
}

// remove removes the box's directories.
func (b *box) remove() error {
	return errors.Join(removeTree(b.root), removeTree(b.root+shmSuffix))
}

// killAll kills the box's processes until none is left or reapGrace has
// passed (what forks meanwhile is killed in the next round).
func (b *box) killAll() {
	deadline := time.Now().Add(reapGrace)
	for members := b.members(); len(members) > 0 && time.Now().Before(deadline); members = b.members() {
		killMembers(members)
		time.Sleep(time.Millisecond)
	}
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
// one at a time, each in a fresh box, the next box's program pre-started
// while a run is in progress. After each run everything of it goes (every
// process of its box is killed; its directory is removed) and the runner
// checks that nothing is left. A run that left something, or that used up
// the served config's maxRuns or maxAgeSeconds, retires the sandbox: its
// result says retiring, and the runner takes no further run.
type boxedRuns struct {
	served  Config
	opts    Options
	started time.Time
	// problems gets what went wrong between runs (the runner's stderr).
	problems func(error)

	// runMu is held by a run.
	runMu sync.Mutex
	runs  int
	// nextMu is held while the next box is prepared or taken.
	nextMu  sync.Mutex
	next    *warmChild
	nextBox *box
	made    int
	// retiring is read without a lock, by a claim while a box is prepared.
	retiring atomic.Bool
	// programs are the boxes' own programs, which their runs wait for: the
	// orphans' reaper leaves them alone.
	programs    sync.Map
	stopReaping chan struct{}
}

// orphansReapInterval is how often, as PID 1, the runner reaps the boxes'
// processes that were orphaned to it and killed.
const orphansReapInterval = 100 * time.Millisecond

func newBoxedRuns(served Config, opts Options, problems func(error)) (*boxedRuns, error) {
	b := &boxedRuns{
		served: served, opts: opts, started: time.Now(), problems: problems,
		stopReaping: make(chan struct{}),
	}
	if err := os.MkdirAll(b.boxesDir(), 0o755); err != nil {
		return nil, fmt.Errorf("creating the boxes' directory: %w", err)
	}
	if os.Getpid() == 1 {
		go b.reapOrphans()
	}
	b.nextMu.Lock()
	defer b.nextMu.Unlock()
	return b, b.prepare()
}

func (b *boxedRuns) boxesDir() string {
	return filepath.Join(filepath.Dir(b.opts.WorkDir), boxesDirName)
}

// prepare makes the next box and pre-starts its program; nextMu is held.
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
		inBox.remove()
		return err
	}
	b.next, b.nextBox = child, inBox
	return nil
}

// prepareNext pre-starts the next run's program unless that is done.
func (b *boxedRuns) prepareNext() {
	b.nextMu.Lock()
	defer b.nextMu.Unlock()
	if b.next != nil || b.retiring.Load() {
		return
	}
	// The next run tries again.
	if err := b.prepare(); err != nil {
		b.problems(fmt.Errorf("preparing the next run's box: %w", err))
	}
}

// take hands out the pre-started program of the next run (waiting for its
// preparation, or preparing it now). The run before, whose user it shared,
// may have stopped it (it is continued) or killed it (it is replaced): what
// a run does to the next box never reaches the next run.
func (b *boxedRuns) take() (*warmChild, *box, error) {
	b.nextMu.Lock()
	defer b.nextMu.Unlock()
	if b.next != nil && !b.next.alive() {
		b.next.abandon()
		b.nextBox.remove()
		b.next, b.nextBox = nil, nil
	}
	if b.next == nil {
		if err := b.prepare(); err != nil {
			return nil, nil, err
		}
	}
	child, inBox := b.next, b.nextBox
	b.next, b.nextBox = nil, nil
	return child, inBox, nil
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
	b.runMu.Lock()
	defer b.runMu.Unlock()
	child, inBox, err := b.take()
	if err != nil {
		b.retiring.Store(true)
		result := failedResult(err)
		result.Retiring = true
		return result
	}
	b.runs++
	last := b.runs >= b.served.MaxRuns || b.pastAge()
	if !last {
		go b.prepareNext()
	}
	result := child.run(ctx, cfg, request, frames)
	if err := b.clear(inBox); err != nil {
		b.retiring.Store(true)
		b.problems(fmt.Errorf("the sandbox retires: %w", err))
	}
	if last {
		b.retiring.Store(true)
	}
	result.Retiring = b.retiring.Load()
	if result.Retiring {
		b.closeNext()
	}
	return result
}

// clear removes the run's box and says what of the run is left, if anything:
// a process of its box, anything in the scratch root but the boxes'
// directory, or anything in that but the next box.
func (b *boxedRuns) clear(inBox *box) error {
	if left := inBox.members(); len(left) > 0 {
		return fmt.Errorf("processes of the run are left: %v", left)
	}
	if err := inBox.remove(); err != nil {
		return fmt.Errorf("removing the run's box: %w", err)
	}
	next := strconv.Itoa(b.made)
	for dir, allowed := range map[string][]string{
		inBox.scratch: {boxesDirName},
		b.boxesDir():  {next, next + shmSuffix},
	} {
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

// reapOrphans reaps, as PID 1, the processes orphaned to the runner (a box's
// daemons, killed with their box), never a program the runner started, which
// its own reaper waits for (startProcess).
func (b *boxedRuns) reapOrphans() {
	ticker := time.NewTicker(orphansReapInterval)
	defer ticker.Stop()
	self := os.Getpid()
	for {
		select {
		case <-b.stopReaping:
			return
		case <-ticker.C:
		}
		for _, pid := range processes() {
			if _, own := ownChildren.Load(pid); own || pid == self {
				continue
			}
			if parent, ok := parentOf(pid); ok && parent == self {
				var status syscall.WaitStatus
				_, _ = syscall.Wait4(pid, &status, syscall.WNOHANG, nil)
			}
		}
	}
}

// closeNext kills the pre-started program of a next run that will not come.
func (b *boxedRuns) closeNext() {
	b.nextMu.Lock()
	defer b.nextMu.Unlock()
	if b.next != nil {
		b.next.close()
		b.nextBox.remove()
		b.next, b.nextBox = nil, nil
	}
}

// close ends serving: the next run's program is killed.
func (b *boxedRuns) close() {
	b.retiring.Store(true)
	b.closeNext()
	select {
	case <-b.stopReaping:
	default:
		close(b.stopReaping)
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
