package runner

import (
	"fmt"
	"syscall"
	"unsafe"
)

// The program runs under a seccomp filter that the shim installs right before
// exec. It keeps the program away from the runner (signals, ptrace, memory
// access, pidfds, resource limits aimed at the runner's pid) and from the
// kernel features that are known escalation paths (namespaces, mounts, bpf,
// keyrings, io_uring, ...). gVisor evaluates filters that a sandboxed process
// installs itself. x86_64 only; the rules are in seccompRules.

const (
	auditArchX8664 = 0xC000003E
	// x32SyscallBit marks x32 ABI syscalls, which share x86_64's audit arch.
	x32SyscallBit = 0x40000000

	seccompRetKillProcess = 0x80000000
	seccompRetErrno       = 0x00050000
	seccompRetAllow       = 0x7FFF0000

	seccompSetModeFilter   = 1
	seccompFilterFlagTsync = 1
	prSetNoNewPrivs        = 38
	prSetDumpable          = 4

	sysSeccomp = 317

	// Offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6].
	seccompDataNr   = 0
	seccompDataArch = 4
	seccompDataArgs = 16

	// cloneNewFlags are every CLONE_NEW* flag: NEWTIME, NEWNS, NEWCGROUP,
	// NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
	cloneNewFlags = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 |
		0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)

// x86_64 syscall numbers the filter names (package syscall lacks the newer ones).
const (
	sysKill              = 62
	sysTkill             = 200
	sysTgkill            = 234
	sysRtSigqueueinfo    = 129
	sysRtTgsigqueueinfo  = 297
	sysPidfdOpen         = 434
	sysPidfdSendSignal   = 424
	sysPidfdGetfd        = 438
	sysPtrace            = 101
	sysProcessVMReadv    = 310
	sysProcessVMWritev   = 311
	sysKcmp              = 312
	sysPrlimit64         = 302
	sysSetpriority       = 141
	sysSchedSetparam     = 142
	sysSchedSetscheduler = 144
	sysSchedSetaffinity  = 203
	sysIoprioSet         = 251
	sysUnshare           = 272
	sysSetns             = 308
	sysClone             = 56
	sysClone3            = 435
	sysMount             = 165
	sysUmount2           = 166
	sysPivotRoot         = 155
	sysChroot            = 161
	sysOpenTree          = 428
	sysMoveMount         = 429
	sysFsopen            = 430
	sysFsconfig          = 431
	sysFsmount           = 432
	sysFspick            = 433
	sysMountSetattr      = 442
	sysBpf               = 321
	sysPerfEventOpen     = 298
	sysUserfaultfd       = 323
	sysKeyctl            = 250
	sysAddKey            = 248
	sysRequestKey        = 249
	sysIoUringSetup      = 425
	sysIoUringEnter      = 426
	sysIoUringRegister   = 427
	sysOpenByHandleAt    = 304
	sysNameToHandleAt    = 303
	sysFcntl             = 72
	sysIoctl             = 16

	fcntlSetown    = 8  // F_SETOWN
	fcntlSetownEx  = 15 // F_SETOWN_EX
	ioctlFIOSETOWN = 0x8901
	ioctlSIOCSPGRP = 0x8902
)

// condOp compares the low 32 bits of a syscall argument. Every argument the
// filter looks at is an int, a pid_t or (clone) flags of which the kernel
// reads only the low 32 bits, so the high half cannot smuggle a value past it.
type condOp int

const (
	opEqual condOp = iota
	opAnyBits
)

// argCond holds when the low 32 bits of argument Arg are equal to Value
// (opEqual) or share a bit with it (opAnyBits).
type argCond struct {
	Arg   int
	Op    condOp
	Value uint32
}

// seccompRule returns Errno from syscall Nr when every condition holds
// (always, without conditions).
type seccompRule struct {
	Nr    uint32
	Errno syscall.Errno
	Conds []argCond
}

// guardTarget is who the filter protects: the runner's pid and process group.
type guardTarget struct {
	Pid  int
	Pgid int
}

func pidIs(arg int, pid int) argCond {
	return argCond{Arg: arg, Op: opEqual, Value: uint32(int32(pid))}
}

// seccompRules is the filter's table; docs/runner-protocol.md lists it.
func seccompRules(target guardTarget) []seccompRule {
	eperm := func(nr uint32, conds ...argCond) seccompRule {
		return seccompRule{Nr: nr, Errno: syscall.EPERM, Conds: conds}
	}
	runner := target.Pid
	// The pids of kill and rt_sigqueueinfo that reach the runner: itself,
	// every process (-1) and its process group (-pgid; the same as -1 when
	// the runner is PID 1 in its own group). kill(0) stays allowed: the
	// program has a process group of its own.
	signalTargets := []int{runner, -1}
	if target.Pgid > 1 {
		signalTargets = append(signalTargets, -target.Pgid)
	}
	var rules []seccompRule
	for _, nr := range []uint32{sysKill, sysRtSigqueueinfo} {
		for _, pid := range signalTargets {
			rules = append(rules, eperm(nr, pidIs(0, pid)))
		}
	}
	// A descriptor's owner receives SIGIO, or any signal F_SETSIG names,
	// when I/O happens: the owner must not be the runner or its group
	// (-pgid; 0 means no owner, and a pgid of 0 is a group outside the pid
	// namespace). F_SETOWN_EX and the ioctls pass the owner in memory, out
	// of a filter's reach.
	owners := []int{runner}
	if target.Pgid > 0 {
		owners = append(owners, -target.Pgid)
	}
	for _, owner := range owners {
		rules = append(rules, eperm(sysFcntl, argCond{Arg: 1, Op: opEqual, Value: fcntlSetown}, pidIs(2, owner)))
	}
	rules = append(rules, []seccompRule{
		eperm(sysFcntl, argCond{Arg: 1, Op: opEqual, Value: fcntlSetownEx}),
		eperm(sysIoctl, argCond{Arg: 1, Op: opEqual, Value: ioctlFIOSETOWN}),
		eperm(sysIoctl, argCond{Arg: 1, Op: opEqual, Value: ioctlSIOCSPGRP}),
		eperm(sysTgkill, pidIs(0, runner)),
		eperm(sysRtTgsigqueueinfo, pidIs(0, runner)),
		// tkill names a thread only, and the runner's threads have other ids.
		eperm(sysTkill),
		eperm(sysPidfdOpen, pidIs(0, runner)),
		// A pidfd can also come from opening /proc/<pid>.
		eperm(sysPidfdSendSignal),
		eperm(sysPidfdGetfd),
		// Reading or changing the runner.
		eperm(sysPtrace),
		eperm(sysProcessVMReadv),
		eperm(sysProcessVMWritev),
		eperm(sysKcmp),
		eperm(sysPrlimit64, pidIs(0, runner)),
		eperm(sysSetpriority, pidIs(1, runner)),
		eperm(sysSchedSetparam, pidIs(0, runner)),
		eperm(sysSchedSetscheduler, pidIs(0, runner)),
		eperm(sysSchedSetaffinity, pidIs(0, runner)),
		eperm(sysIoprioSet, pidIs(1, runner)),
		// Namespaces.
		eperm(sysUnshare),
		eperm(sysSetns),
		eperm(sysClone, argCond{Arg: 0, Op: opAnyBits, Value: cloneNewFlags}),
		// clone3 passes its flags in memory, out of a filter's reach; ENOSYS
		// makes libcs fall back to clone.
		{Nr: sysClone3, Errno: syscall.ENOSYS},
		// Mounts and file handles.
		eperm(sysMount),
		eperm(sysUmount2),
		eperm(sysPivotRoot),
		eperm(sysChroot),
		eperm(sysOpenTree),
		eperm(sysMoveMount),
		eperm(sysFsopen),
		eperm(sysFsconfig),
		eperm(sysFsmount),
		eperm(sysFspick),
		eperm(sysMountSetattr),
		eperm(sysOpenByHandleAt),
		eperm(sysNameToHandleAt),
		// Kernel attack surface.
		eperm(sysBpf),
		eperm(sysPerfEventOpen),
		eperm(sysUserfaultfd),
		eperm(sysKeyctl),
		eperm(sysAddKey),
		eperm(sysRequestKey),
		// io_uring operations are not syscalls: a filter cannot see them.
		eperm(sysIoUringSetup),
		eperm(sysIoUringEnter),
		eperm(sysIoUringRegister),
	}...)
	return rules
}

// Classic BPF opcodes used by the filter.
const (
	bpfLdWAbs  = syscall.BPF_LD | syscall.BPF_W | syscall.BPF_ABS
	bpfJeqK    = syscall.BPF_JMP | syscall.BPF_JEQ | syscall.BPF_K
	bpfJgeK    = syscall.BPF_JMP | syscall.BPF_JGE | syscall.BPF_K
	bpfJsetK   = syscall.BPF_JMP | syscall.BPF_JSET | syscall.BPF_K
	bpfRetK    = syscall.BPF_RET | syscall.BPF_K
	maxBPFJump = 255
)

func bpfStmt(code uint16, k uint32) syscall.SockFilter {
	return syscall.SockFilter{Code: code, K: k}
}

func bpfJump(code uint16, k uint32, jt, jf uint8) syscall.SockFilter {
	return syscall.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

// buildSeccompFilter compiles rules to classic BPF: kill the process on
// another architecture or an x32 syscall; then, per syscall in table order,
// its rules in order (the first that holds returns its errno) and ALLOW;
// ALLOW for any syscall not in the table.
func buildSeccompFilter(rules []seccompRule) ([]syscall.SockFilter, error) {
	program := []syscall.SockFilter{
		bpfStmt(bpfLdWAbs, seccompDataArch),
		bpfJump(bpfJeqK, auditArchX8664, 1, 0),
		bpfStmt(bpfRetK, seccompRetKillProcess),
		bpfStmt(bpfLdWAbs, seccompDataNr),
		bpfJump(bpfJgeK, x32SyscallBit, 0, 1),
		bpfStmt(bpfRetK, seccompRetKillProcess),
	}
	for _, group := range groupByNr(rules) {
		var body []syscall.SockFilter
		for _, rule := range group {
			instructions, err := compileRule(rule)
			if err != nil {
				return nil, err
			}
			body = append(body, instructions...)
		}
		// Every path through a body returns, so the accumulator still holds
		// the syscall number at the next group's test.
		body = append(body, bpfStmt(bpfRetK, seccompRetAllow))
		if len(body) > maxBPFJump {
			return nil, fmt.Errorf("seccomp rules for syscall %d need %d instructions", group[0].Nr, len(body))
		}
		program = append(program, bpfJump(bpfJeqK, group[0].Nr, 0, uint8(len(body))))
		program = append(program, body...)
	}
	return append(program, bpfStmt(bpfRetK, seccompRetAllow)), nil
}

// groupByNr gathers the rules of each syscall, in order of first appearance.
func groupByNr(rules []seccompRule) [][]seccompRule {
	index := map[uint32]int{}
	var groups [][]seccompRule
	for _, rule := range rules {
		i, seen := index[rule.Nr]
		if !seen {
			i = len(groups)
			index[rule.Nr] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], rule)
	}
	return groups
}

// compileRule tests each condition in turn, skipping to the end of the rule
// when one fails, and returns the rule's errno when all hold.
func compileRule(rule seccompRule) ([]syscall.SockFilter, error) {
	action := bpfStmt(bpfRetK, seccompRetErrno|uint32(rule.Errno))
	remaining := 2*len(rule.Conds) + 1
	var instructions []syscall.SockFilter
	for _, cond := range rule.Conds {
		if cond.Arg < 0 || cond.Arg > 5 {
			return nil, fmt.Errorf("syscall %d: no argument %d", rule.Nr, cond.Arg)
		}
		// skip jumps past the rest of this rule, its action included.
		skip := uint8(remaining - 2)
		instructions = append(instructions, bpfStmt(bpfLdWAbs, uint32(seccompDataArgs+8*cond.Arg)))
		switch cond.Op {
		case opEqual:
			instructions = append(instructions, bpfJump(bpfJeqK, cond.Value, 0, skip))
		case opAnyBits:
			instructions = append(instructions, bpfJump(bpfJsetK, cond.Value, 0, skip))
		default:
			return nil, fmt.Errorf("syscall %d: unknown condition %d", rule.Nr, cond.Op)
		}
		remaining -= 2
	}
	return append(instructions, action), nil
}

// installSeccompFilter sets no_new_privs and installs the filter on every
// thread of the calling process, for it and what it execs.
func installSeccompFilter(program []syscall.SockFilter) error {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0, 0, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", errno)
	}
	fprog := syscall.SockFprog{Len: uint16(len(program)), Filter: &program[0]}
	// With TSYNC a positive result is the id of a thread that could not
	// take the filter.
	thread, _, errno := syscall.RawSyscall(sysSeccomp, seccompSetModeFilter, seccompFilterFlagTsync, uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", errno)
	}
	if thread != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): thread %d could not be synchronised", thread)
	}
	return nil
}

// makeNonDumpable keeps processes of the same uid out of the runner's
// /proc/<pid>/fd, mem and environ, and from ptrace-attaching to it.
func makeNonDumpable() error {
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetDumpable, 0, 0, 0, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}
