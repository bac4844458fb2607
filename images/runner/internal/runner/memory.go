package runner

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// memoryPollInterval is how often the memory a run holds is measured. A
// program that allocates faster than the sandbox's headroom per interval
// could outrun it; gVisor faults pages in at well under 1 GiB/s, so a poll
// every 10 ms lets a run overshoot its limit by a few MiB at most.
const memoryPollInterval = 10 * time.Millisecond

// tmpfsMagic is statfs's f_type of a tmpfs (linux/magic.h TMPFS_MAGIC).
const tmpfsMagic = 0x01021994

// sandboxMemoryFile is, under gVisor, the sandbox's own account of all the
// memory it holds (anonymous, tmpfs and cache, each page once: what its pod's
// limit is charged for).
const sandboxMemoryFile = "/sys/fs/cgroup/memory/memory.usage_in_bytes"

// memoryAtStart is what the sandbox held when the runner started (its own):
// a run may hold its limit beyond it.
var memoryAtStart, sandboxAccounted = sandboxMemory()

// sandboxMemory reads sandboxMemoryFile where the runner is a sandbox's PID
// 1; elsewhere (tests) a host's file would speak for the whole host.
func sandboxMemory() (uint64, bool) {
	if os.Getpid() != 1 {
		return 0, false
	}
	text, err := os.ReadFile(sandboxMemoryFile)
	if err != nil {
		return 0, false
	}
	value, err := strconv.ParseUint(string(bytes.TrimSpace(text)), 10, 64)
	return value, err == nil
}

// memoryWatch measures, every memoryPollInterval, the memory a run holds: in
// a sandbox, all the sandbox holds beyond the runner's own at its start
// (pages shared after a fork counted once, the scratch tmpfs included);
// elsewhere the resident memory of its processes and what it keeps in the
// scratch tmpfs. exceeded is closed once that passes the
// limit; a zero limit watches nothing.
type memoryWatch struct {
	exceeded chan struct{}
	stop     chan struct{}
}

// watchMemory starts watching the memory of the run's processes, as members
// lists them, and of the scratch filesystem that scratch is a path on.
func watchMemory(limit uint64, members func() []int, scratch string) *memoryWatch {
	w := &memoryWatch{exceeded: make(chan struct{}), stop: make(chan struct{})}
	if limit == 0 {
		return w
	}
	go func() {
		ticker := time.NewTicker(memoryPollInterval)
		defer ticker.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-ticker.C:
				if heldMemory(members, scratch) > limit {
					close(w.exceeded)
					return
				}
			}
		}
	}()
	return w
}

func (w *memoryWatch) end() {
	close(w.stop)
}

// heldMemory is what the run holds (see memoryWatch).
func heldMemory(members func() []int, scratch string) uint64 {
	if sandboxAccounted {
		if held, ok := sandboxMemory(); ok {
			return held - min(held, memoryAtStart)
		}
	}
	total := scratchBytes(scratch)
	for _, member := range members() {
		total += residentBytes(member)
	}
	return total
}

// killMembers kills every process of the run that can still be found.
func killMembers(members []int) {
	for _, member := range members {
		_ = syscall.Kill(member, syscall.SIGKILL)
	}
}

func scratchBytes(path string) uint64 {
	var fs syscall.Statfs_t
	if path == "" || syscall.Statfs(path, &fs) != nil || fs.Type != tmpfsMagic {
		return 0
	}
	return (fs.Blocks - fs.Bfree) * uint64(fs.Bsize)
}

// residentBytes is the process's resident set (statm's second field).
func residentBytes(pid int) uint64 {
	statm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	fields := bytes.Fields(statm)
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(string(fields[1]), 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

// runMembers are the processes of the run of program pid outside a box:
// every process but this one (all: the runner is PID 1), or pid and its
// descendants.
func runMembers(pid int, all bool) []int {
	if all {
		return otherProcesses()
	}
	parents := processParents()
	children := make(map[int][]int, len(parents))
	for child, parent := range parents {
		children[parent] = append(children[parent], child)
	}
	members := []int{pid}
	for i := 0; i < len(members); i++ {
		members = append(members, children[members[i]]...)
	}
	return members
}

// processes lists every visible process.
func processes() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	pids := make([]int, 0, len(entries))
	for _, entry := range entries {
		if pid, err := strconv.Atoi(entry.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// otherProcesses lists every visible process but this one.
func otherProcesses() []int {
	self := os.Getpid()
	return slices.DeleteFunc(processes(), func(pid int) bool { return pid == self })
}

// processParents maps every visible process to its parent.
func processParents() map[int]int {
	pids := processes()
	parents := make(map[int]int, len(pids))
	for _, pid := range pids {
		if parent, ok := parentOf(pid); ok {
			parents[pid] = parent
		}
	}
	return parents
}

// parentOf reads the ppid from /proc/pid/stat: the field after the state,
// which follows the last ')' (the command name may hold anything).
func parentOf(pid int) (int, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := bytes.Fields(stat[end+1:])
	if len(fields) < 2 {
		return 0, false
	}
	parent, err := strconv.Atoi(string(fields[1]))
	return parent, err == nil
}
