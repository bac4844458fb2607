package runner

import (
	"context"
	"encoding/binary"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBuildSeccompFilterCompilesATable(t *testing.T) {
	program, err := buildSeccompFilter([]seccompRule{
		{Nr: 62, Errno: syscall.EPERM, Conds: []argCond{{Arg: 0, Op: opEqual, Value: 1}}},
		{Nr: 62, Errno: syscall.EPERM, Conds: []argCond{{Arg: 0, Op: opEqual, Value: 0xFFFFFFFF}}},
		{Nr: 200, Errno: syscall.EPERM},
		{Nr: 56, Errno: syscall.EINVAL, Conds: []argCond{{Arg: 0, Op: opAnyBits, Value: 0x10}, {Arg: 2, Op: opEqual, Value: 7}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []syscall.SockFilter{
		{Code: 0x20, K: 4},                                // ld arch
		{Code: 0x15, Jt: 1, K: 0xC000003E},                // jeq x86_64
		{Code: 0x06, K: 0x80000000},                       // ret kill_process
		{Code: 0x20, K: 0},                                // ld nr
		{Code: 0x35, Jf: 1, K: 0x40000000},                // jge x32 bit
		{Code: 0x06, K: 0x80000000},                       // ret kill_process
		{Code: 0x15, Jf: 7, K: 62},                        // jeq kill
		{Code: 0x20, K: 16},                               // ld args[0]
		{Code: 0x15, Jf: 1, K: 1},                         // jeq 1
		{Code: 0x06, K: 0x50000 | 1},                      // ret EPERM
		{Code: 0x20, K: 16},                               // ld args[0]
		{Code: 0x15, Jf: 1, K: 0xFFFFFFFF},                // jeq -1
		{Code: 0x06, K: 0x50000 | 1},                      // ret EPERM
		{Code: 0x06, K: 0x7FFF0000},                       // ret allow
		{Code: 0x15, Jf: 2, K: 200},                       // jeq tkill
		{Code: 0x06, K: 0x50000 | 1},                      // ret EPERM
		{Code: 0x06, K: 0x7FFF0000},                       // ret allow
		{Code: 0x15, Jf: 6, K: 56},                        // jeq clone
		{Code: 0x20, K: 16},                               // ld args[0]
		{Code: 0x45, Jf: 3, K: 0x10},                      // jset 0x10
		{Code: 0x20, K: 32},                               // ld args[2]
		{Code: 0x15, Jf: 1, K: 7},                         // jeq 7
		{Code: 0x06, K: 0x50000 | uint32(syscall.EINVAL)}, // ret EINVAL
		{Code: 0x06, K: 0x7FFF0000},                       // ret allow
		{Code: 0x06, K: 0x7FFF0000},                       // ret allow
	}
	if !slices.Equal(program, want) {
		t.Errorf("program\n got %+v\nwant %+v", program, want)
	}
}

func TestBuildSeccompFilterRejectsABadArgument(t *testing.T) {
	_, err := buildSeccompFilter([]seccompRule{{Nr: 1, Errno: syscall.EPERM, Conds: []argCond{{Arg: 6}}}})
	if err == nil {
		t.Error("argument 6 accepted")
	}
}

// seccompData is struct seccomp_data as the kernel lays it out.
func seccompData(arch uint32, nr uint32, args ...uint64) []byte {
	data := make([]byte, 64)
	binary.LittleEndian.PutUint32(data[0:], nr)
	binary.LittleEndian.PutUint32(data[4:], arch)
	for i, arg := range args {
		binary.LittleEndian.PutUint64(data[16+8*i:], arg)
	}
	return data
}

// runBPF interprets the subset of classic BPF the generator emits.
func runBPF(t *testing.T, program []syscall.SockFilter, data []byte) uint32 {
	t.Helper()
	var a uint32
	for pc := 0; pc < len(program); pc++ {
		ins := program[pc]
		switch ins.Code {
		case bpfLdWAbs:
			a = binary.LittleEndian.Uint32(data[ins.K:])
		case bpfJeqK, bpfJgeK, bpfJsetK:
			taken := (ins.Code == bpfJeqK && a == ins.K) || (ins.Code == bpfJgeK && a >= ins.K) ||
				(ins.Code == bpfJsetK && a&ins.K != 0)
			if taken {
				pc += int(ins.Jt)
			} else {
				pc += int(ins.Jf)
			}
		case bpfRetK:
			return ins.K
		default:
			t.Fatalf("unexpected instruction %+v", ins)
		}
	}
	t.Fatal("the program ran off its end")
	return 0
}

func TestSeccompFilterDecisions(t *testing.T) {
	program, err := buildSeccompFilter(seccompRules(guardTarget{Pid: 1, Pgid: 1}))
	if err != nil {
		t.Fatal(err)
	}
	eperm := uint32(seccompRetErrno | uint32(syscall.EPERM))
	enosys := uint32(seccompRetErrno | uint32(syscall.ENOSYS))
	minusOne := uint64(0xFFFFFFFFFFFFFFFF)
	cases := []struct {
		name string
		data []byte
		want uint32
	}{
		{"kill(1, SIGKILL)", seccompData(auditArchX8664, sysKill, 1, 9), eperm},
		{"kill(1) with high bits", seccompData(auditArchX8664, sysKill, 1<<32|1, 9), eperm},
		{"kill(-1, SIGKILL)", seccompData(auditArchX8664, sysKill, minusOne, 9), eperm},
		{"kill(0, SIGKILL)", seccompData(auditArchX8664, sysKill, 0, 9), seccompRetAllow},
		{"kill(7, SIGKILL)", seccompData(auditArchX8664, sysKill, 7, 9), seccompRetAllow},
		{"kill(-7, SIGKILL)", seccompData(auditArchX8664, sysKill, uint64(0xFFFFFFFFFFFFFFF9), 9), seccompRetAllow},
		{"rt_sigqueueinfo(1)", seccompData(auditArchX8664, sysRtSigqueueinfo, 1, 19), eperm},
		{"tgkill(1, 5, SIGSTOP)", seccompData(auditArchX8664, sysTgkill, 1, 5, 19), eperm},
		{"tgkill(7, 7, SIGTERM)", seccompData(auditArchX8664, sysTgkill, 7, 7, 15), seccompRetAllow},
		{"rt_tgsigqueueinfo(1)", seccompData(auditArchX8664, sysRtTgsigqueueinfo, 1, 1, 9), eperm},
		{"tkill", seccompData(auditArchX8664, sysTkill, 7, 9), eperm},
		{"pidfd_open(1)", seccompData(auditArchX8664, sysPidfdOpen, 1), eperm},
		{"pidfd_open(7)", seccompData(auditArchX8664, sysPidfdOpen, 7), seccompRetAllow},
		{"pidfd_send_signal", seccompData(auditArchX8664, sysPidfdSendSignal, 3, 9), eperm},
		{"ptrace", seccompData(auditArchX8664, sysPtrace, 16, 1), eperm},
		{"process_vm_readv", seccompData(auditArchX8664, sysProcessVMReadv, 1), eperm},
		{"prlimit64(1)", seccompData(auditArchX8664, sysPrlimit64, 1, 1), eperm},
		{"prlimit64(0)", seccompData(auditArchX8664, sysPrlimit64, 0, 7), seccompRetAllow},
		{"setpriority(PRIO_PROCESS, 1)", seccompData(auditArchX8664, sysSetpriority, 0, 1, 19), eperm},
		{"unshare", seccompData(auditArchX8664, sysUnshare, 0x10000000), eperm},
		{"setns", seccompData(auditArchX8664, sysSetns, 3, 0), eperm},
		{"clone(CLONE_NEWUSER)", seccompData(auditArchX8664, sysClone, 0x10000000|17), eperm},
		{"clone(CLONE_NEWTIME)", seccompData(auditArchX8664, sysClone, 0x80|17), eperm},
		{"clone for fork", seccompData(auditArchX8664, sysClone, 0x01200011), seccompRetAllow},
		{"clone for a thread", seccompData(auditArchX8664, sysClone, 0x003D0F00), seccompRetAllow},
		{"clone3", seccompData(auditArchX8664, sysClone3, 0, 88), enosys},
		{"mount", seccompData(auditArchX8664, sysMount), eperm},
		{"bpf", seccompData(auditArchX8664, sysBpf), eperm},
		{"io_uring_setup", seccompData(auditArchX8664, sysIoUringSetup), eperm},
		{"keyctl", seccompData(auditArchX8664, sysKeyctl), eperm},
		{"fcntl(F_SETOWN, 1)", seccompData(auditArchX8664, sysFcntl, 3, fcntlSetown, 1), eperm},
		{"fcntl(F_SETOWN, -1)", seccompData(auditArchX8664, sysFcntl, 3, fcntlSetown, minusOne), eperm},
		{"fcntl(F_SETOWN, 7)", seccompData(auditArchX8664, sysFcntl, 3, fcntlSetown, 7), seccompRetAllow},
		{"fcntl(F_SETOWN_EX)", seccompData(auditArchX8664, sysFcntl, 3, fcntlSetownEx, 0x7ff0), eperm},
		{"fcntl(F_SETFL)", seccompData(auditArchX8664, sysFcntl, 3, 4, 0x800), seccompRetAllow},
		{"ioctl(FIOSETOWN)", seccompData(auditArchX8664, sysIoctl, 3, ioctlFIOSETOWN, 0x7ff0), eperm},
		{"ioctl(TCGETS)", seccompData(auditArchX8664, sysIoctl, 0, 0x5401, 0x7ff0), seccompRetAllow},
		{"read", seccompData(auditArchX8664, 0, 0), seccompRetAllow},
		{"execve", seccompData(auditArchX8664, 59), seccompRetAllow},
		{"x32 kill", seccompData(auditArchX8664, x32SyscallBit|sysKill, 1, 9), seccompRetKillProcess},
		{"i386", seccompData(0x40000003, 37, 1, 9), seccompRetKillProcess},
	}
	for _, tc := range cases {
		if got := runBPF(t, program, tc.data); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.name, got, tc.want)
		}
	}
}

func TestSeccompRulesProtectTheRunnersProcessGroup(t *testing.T) {
	program, err := buildSeccompFilter(seccompRules(guardTarget{Pid: 40, Pgid: 30}))
	if err != nil {
		t.Fatal(err)
	}
	if got := runBPF(t, program, seccompData(auditArchX8664, sysKill, uint64(0xFFFFFFFFFFFFFFE2), 9)); got != seccompRetErrno|uint32(syscall.EPERM) {
		t.Errorf("kill(-30): %#x", got)
	}
	if got := runBPF(t, program, seccompData(auditArchX8664, sysKill, 1, 9)); got != seccompRetAllow {
		t.Errorf("kill(1) when the runner is 40: %#x", got)
	}
	outside, err := buildSeccompFilter(seccompRules(guardTarget{Pid: 1, Pgid: 0}))
	if err != nil {
		t.Fatal(err)
	}
	if got := runBPF(t, outside, seccompData(auditArchX8664, sysFcntl, 3, fcntlSetown, 0)); got != seccompRetAllow {
		t.Errorf("F_SETOWN(0) clears the owner, denied when the runner's group is outside its pid namespace: %#x", got)
	}
}

// probeEnv makes the test binary, run as the program, try what the filter forbids.
const probeEnv = "SANDPOD_RUNNER_TEST_PROBE"

// runProbes tries each syscall and prints "name: errno" (or "name: ok").
func runProbes() {
	runner := os.Getppid()
	runnerGroup, _ := syscall.Getpgid(runner)
	probe := func(name string, nr uintptr, args ...uintptr) {
		var a [6]uintptr
		copy(a[:], args)
		_, _, errno := syscall.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		result := "ok"
		if errno != 0 {
			result = errnoName(errno)
		}
		os.Stdout.WriteString(name + ": " + result + "\n")
	}
	// Signal 0 checks permission and delivers nothing, so a filter that
	// fails lets these succeed without harm.
	probe("kill-runner", sysKill, uintptr(runner), 0)
	probe("kill-all", sysKill, ^uintptr(0), 0)
	probe("kill-runner-group", sysKill, uintptr(-runnerGroup), 0)
	probe("kill-own-group", sysKill, 0, 0)
	probe("tgkill-runner", sysTgkill, uintptr(runner), uintptr(runner), 0)
	probe("tgkill-self", sysTgkill, uintptr(os.Getpid()), uintptr(syscall.Gettid()), 0)
	probe("pidfd-open-runner", sysPidfdOpen, uintptr(runner), 0)
	probe("ptrace-runner", sysPtrace, syscall.PTRACE_ATTACH, uintptr(runner))
	probe("prlimit-runner", sysPrlimit64, uintptr(runner), syscall.RLIMIT_NOFILE, 0, 0)
	probe("fcntl-setown-runner", sysFcntl, 1, fcntlSetown, uintptr(runner))
	probe("unshare-user", sysUnshare, 0x10000000)
	probe("clone3", sysClone3, 0, 0)
	fd, err := syscall.Open("/proc/"+strconv.Itoa(runner)+"/fd/1", syscall.O_WRONLY, 0)
	if err == nil {
		_ = syscall.Close(fd)
		os.Stdout.WriteString("open-runner-stdout: ok\n")
	} else {
		os.Stdout.WriteString("open-runner-stdout: " + errnoName(err.(syscall.Errno)) + "\n")
	}
	os.Exit(0)
}

func errnoName(errno syscall.Errno) string {
	switch errno {
	case syscall.EPERM:
		return "EPERM"
	case syscall.EACCES:
		return "EACCES"
	case syscall.ENOSYS:
		return "ENOSYS"
	default:
		return errno.Error()
	}
}

// TestTheFilterGuardsTheRunner runs the probes as the program of a runner in
// its own (non-dumpable) process; the filter protects that runner's pid.
func TestTheFilterGuardsTheRunner(t *testing.T) {
	f := newShellFixture(t, "")
	f.config.Command = []string{os.Args[0]}
	f.config.Env = map[string]string{probeEnv: "1"}
	output, _ := f.runInProcess(nil)
	assertProbesDenied(t, output)
}

// assertProbesDenied checks the output of runProbes run as the program.
func assertProbesDenied(t *testing.T, output runnerOutput) {
	t.Helper()
	assertExit(t, output, intPtr(0), nil)
	got := strings.Split(strings.TrimSpace(output.text(StreamStdout)), "\n")
	want := []string{
		"kill-runner: EPERM",
		"kill-all: EPERM",
		"kill-runner-group: EPERM",
		"kill-own-group: ok",
		"tgkill-runner: EPERM",
		"tgkill-self: ok",
		"pidfd-open-runner: EPERM",
		"ptrace-runner: EPERM",
		"prlimit-runner: EPERM",
		"fcntl-setown-runner: EPERM",
		"unshare-user: EPERM",
		"clone3: ENOSYS",
		// Not the filter: the runner is not dumpable.
		"open-runner-stdout: EACCES",
	}
	if os.Geteuid() == 0 {
		// CAP_SYS_PTRACE overrides non-dumpable; in the sandbox the program
		// has no capabilities (the gVisor trial in the protocol doc).
		t.Log("running as root: the program may open the runner's descriptors here")
		want[len(want)-1] = "open-runner-stdout: ok"
	}
	if !slices.Equal(got, want) {
		t.Errorf("probes\n got %q\nwant %q", got, want)
	}
}

// BenchmarkStartup measures a program's start through the shim with and
// without the filter (the numbers in docs/runner-protocol.md):
// go test -run '^$' -bench Startup -benchtime 50x ./internal/runner/
func BenchmarkStartup(b *testing.B) {
	programs := map[string][]string{"true": {"true"}, "python": {"python3", "-c", "print(1)"}}
	guards := map[string]guardTarget{"filter": {Pid: os.Getpid(), Pgid: syscall.Getpgrp()}, "nofilter": {}}
	for _, program := range []string{"true", "python"} {
		for _, guard := range []string{"nofilter", "filter"} {
			b.Run(program+"/"+guard, func(b *testing.B) {
				devNull, err := os.Open(os.DevNull)
				if err != nil {
					b.Fatal(err)
				}
				defer devNull.Close()
				spec := processSpec{
					argv: programs[program], env: []string{"PATH=" + DefaultPath}, dir: b.TempDir(),
					stdin: devNull, timeout: time.Minute, selfExe: selfExePath, guard: guards[guard],
				}
				for b.Loop() {
					outcome := runProcess(context.Background(), spec, io.Discard, io.Discard)
					if outcome.exitCode == nil || *outcome.exitCode != 0 {
						b.Fatalf("%s: %+v", program, outcome)
					}
				}
			})
		}
	}
}
