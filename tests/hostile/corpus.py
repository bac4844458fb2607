"""The hostile corpus: programs that attack the sandbox, and what a demanding user expects.

Each case is run as a CodeExecution under gVisor (test_corpus.py), next to a benign
neighbour. Each names its `proof`: the one outcome that shows the sandbox contained it (a
fork bomb's process count stopped at the limit, not "some failure"), checked through the
terminal phase/reason and the program's own report of what it met (exact where it can be).
A network case first shows its targets reachable without the policy (policy_free.py).
`args` may name facts of the cluster that are only known at run time: {node_ip}, {peer_ip},
{peer_port}, {public_ip}, {metadata_ip}, {fake_port}, {api_service}, {api_endpoint},
{dns_service}.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

Outcome = tuple[str, str]  # (phase, reason)
SUCCEEDED: tuple[Outcome, ...] = (("Succeeded", "Completed"),)
TIMED_OUT: tuple[Outcome, ...] = (("TimedOut", "DeadlineExceeded"),)
ABSENT = object()  # a status field that must not be set

MARKER = "sp-hostile-marker"
# Text a program writes where the platform's words live (termination log, runner's stdout):
# it must never appear in a status's message or reason.
FORGED = "SP-FORGED"

# The platform's default RLIMIT_NPROC in a sandbox (operator setting `process_limit`, chart
# value `operator.config.processLimit`), which the session's operator keeps.
PROCESS_LIMIT = 128
# RLIMIT_NPROC counts every task (thread) of the uid in the sandbox's gVisor kernel. The
# program sees its own and the runner's; the pod's pause process (its pod-level uid, the
# same, in the same kernel, another PID namespace) is the one it cannot see.
TASKS_IN_VIEW_AT_LIMIT = PROCESS_LIMIT - 1
# The programs count by walking /proc, not from one snapshot: a task that ends during the walk
# (a runner thread) and the bomb's fork that takes its place may both be counted, one more than
# the limit leaves (seen once in a full run, 2026-11-29: 128).
TASKS_IN_VIEW_PATTERN = rf"tasks ({TASKS_IN_VIEW_AT_LIMIT}|{TASKS_IN_VIEW_AT_LIMIT + 1})\n"

# How a connection fails when a NetworkPolicy stops it: the local cluster's enforcer rejects
# (a TCP reset, or ICMP port-unreachable through a service IP: both ECONNREFUSED); enforcers
# that drop make it time out. A refusal proves the policy only because the same target was
# first reached without the policy (policy_free.py): something listens there.
NOT_CONNECTED = "(ConnectionRefusedError|TimeoutError)"

# A Python program that tries TCP connections to each "host:port" argument and says how each
# went: "open", or "blocked" with the error.
TCP_PROBE = """\
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        print("open", target)
    except OSError as error:
        print("blocked", target, type(error).__name__)
"""


def all_open(count: int) -> str:
    """The policy-free run's stdout: each of `count` targets connected."""
    return rf"\A(open [^\n]+\n){{{count}}}\Z"


def none_connected(count: int) -> str:
    """The sandbox's stdout: each of `count` targets refused by the enforcer or timed out."""
    return rf"\A(blocked \S+ {NOT_CONNECTED}\n){{{count}}}\Z"


# DNS questions for a cluster name, straight to the cluster DNS service and its endpoint.
DNS_QUERY = """\
import socket, struct, sys
def query(name):
    header = struct.pack(">HHHHHH", 0x5350, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0"
    return header + labels + struct.pack(">HH", 1, 1)
name = "kubernetes.default.svc.cluster.local"
for server in sys.argv[1:]:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        label = "udp" if kind == socket.SOCK_DGRAM else "tcp"
        try:
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.settimeout(3)
                sock.connect((server, 53))
                packet = query(name)
                if kind == socket.SOCK_STREAM:
                    packet = struct.pack(">H", len(packet)) + packet
                sock.send(packet)
                sock.recv(512)
            print("answered", label, server)
        except OSError as error:
            print("no-answer", label, server, type(error).__name__)
try:
    print("resolved", socket.getaddrinfo(name, 443)[0][4][0])
except OSError as error:
    print("no-resolution", type(error).__name__)
"""

SYSCALLS = """\
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def report(what, rc):
    print(what, "ok" if rc == 0 else errno.errorcode[ctypes.get_errno()])
"""


@dataclass(frozen=True)
class Case:
    id: str
    language: str
    code: str
    expect: tuple[Outcome, ...]
    why: str
    # The one outcome that proves containment, as the results table shows it.
    proof: str
    spec: dict[str, Any] = field(default_factory=dict)
    stdout_contains: tuple[str, ...] = ()
    stdout_excludes: tuple[str, ...] = ()
    stdout_equals: str | None = None
    stdout_pattern: str | None = None
    stderr_contains: tuple[str, ...] = ()
    stderr_equals: str | None = None
    message_contains: tuple[str, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)
    # status.exitCode must be one of these (None: unset), whichever outcome it ended with.
    exit_codes: tuple[int | None, ...] | None = None
    # At least this long (status.durationMs): a deadline is not met early for another reason.
    min_duration_ms: int | None = None
    # A network case: the same program with the same arguments, in a pod without any
    # NetworkPolicy (policy_free.py), must print this (a pattern): its targets are reachable.
    policy_free_stdout: str | None = None
    # Extra time the test allows beyond spec.timeoutSeconds (e.g. kubelet's eviction delay).
    slack_seconds: int = 90

    @property
    def expected_text(self) -> str:
        return " or ".join(f"{phase}/{reason}" for phase, reason in self.expect)

    def spec_for(self, facts: dict[str, str]) -> dict[str, Any]:
        spec: dict[str, Any] = {"language": self.language, "source": self.code, **self.spec}
        if "args" in spec:
            spec["args"] = [fill_in(arg, facts) for arg in spec["args"]]
        return spec

    @property
    def timeout_seconds(self) -> int:
        return int(self.spec.get("timeoutSeconds", 10))


class Variant(NamedTuple):
    """What one case of a family has of its own: the rest is the family's."""

    id: str
    language: str
    code: str
    why: str
    own: dict[str, Any] | None = None


def family(shared: dict[str, Any], *variants: Variant) -> tuple[Case, ...]:
    """Cases that share all but their program, their reason and what `own` overrides."""
    return tuple(
        Case(id=v.id, language=v.language, code=v.code, why=v.why, **{**shared, **(v.own or {})})
        for v in variants
    )


def syscall_case(case_id: str, calls: str, why: str, stdout: str) -> Case:
    """A Python program that makes privileged calls (reported through SYSCALLS), succeeds and
    prints exactly `stdout`: each call's refusal, one line each."""
    return Case(
        id=case_id,
        language="python",
        code=SYSCALLS + calls,
        expect=SUCCEEDED,
        why=why,
        proof=f"each of {stdout.count(chr(10))} lines exactly as expected (every call refused)",
        stdout_equals=stdout,
    )


def blocked_probe(case_id: str, targets: list[str], why: str) -> Case:
    """TCP_PROBE of host:port targets that a pod without the policy reaches (each one open
    there) and that a sandbox must not connect to (each one refused by the enforcer or timed
    out)."""
    return Case(
        id=case_id,
        language="python",
        code=TCP_PROBE,
        spec={"args": targets},
        expect=SUCCEEDED,
        why=why,
        proof=f"{len(targets)} open without the policy, none connects in the sandbox",
        stdout_pattern=none_connected(len(targets)),
        policy_free_stdout=all_open(len(targets)),
    )


def problems(case: Case, status: dict[str, Any], facts: dict[str, str]) -> list[str]:
    """What in an execution's final status falls short of the case's expectation."""
    found: list[str] = []
    excluded = [fill_in(text, facts) for text in case.stdout_excludes]
    outcome = (status.get("phase"), status.get("reason"))
    if outcome not in case.expect:
        found.append(f"ended {outcome[0]}/{outcome[1]}, expected {case.expected_text}")
    stdout, stderr = str(status.get("stdout", "")), str(status.get("stderr", ""))
    message = str(status.get("message", ""))
    if case.stdout_equals is not None and stdout != case.stdout_equals:
        found.append(f"stdout is {stdout[:400]!r}, expected {case.stdout_equals!r}")
    if case.stderr_equals is not None and stderr != case.stderr_equals:
        found.append(f"stderr is {stderr[:400]!r}, expected {case.stderr_equals!r}")
    if case.stdout_pattern is not None and not re.search(case.stdout_pattern, stdout, re.M):
        found.append(f"stdout {stdout[:400]!r} does not match {case.stdout_pattern!r}")
    found += [
        f"stdout lacks {s!r}: {stdout[:400]!r}" for s in case.stdout_contains if s not in stdout
    ]
    found += [f"stdout has {s!r}: {stdout[:400]!r}" for s in excluded if s in stdout]
    found += [
        f"stderr lacks {s!r}: {stderr[-400:]!r}" for s in case.stderr_contains if s not in stderr
    ]
    found += [
        f"message lacks {s!r}: {message!r}" for s in case.message_contains if s not in message
    ]
    if not message:
        found.append("no message says what happened")
    if FORGED in message or FORGED in str(status.get("reason", "")):
        found.append(f"the program's words are in the platform's message: {message!r}")
    if case.exit_codes is not None and status.get("exitCode") not in case.exit_codes:
        found.append(f"status.exitCode is {status.get('exitCode')!r}, not in {case.exit_codes}")
    for name, expected in case.fields.items():
        if expected is ABSENT:
            if name in status:
                found.append(f"status.{name} is {status[name]!r}, expected it unset")
        elif status.get(name) != expected:
            found.append(f"status.{name} is {status.get(name)!r}, expected {expected!r}")
    duration = status.get("durationMs")
    if case.min_duration_ms is not None and (duration is None or duration < case.min_duration_ms):
        found.append(f"durationMs is {duration}, expected at least {case.min_duration_ms}")
    return found


def fill_in(text: str, facts: dict[str, str]) -> str:
    """`text` with each {fact} replaced (only known names: patterns keep their braces)."""
    for name, value in facts.items():
        text = text.replace("{" + name + "}", value)
    return text


def observed_text(status: dict[str, Any]) -> str:
    return f"{status.get('phase')}/{status.get('reason')}"


def observed_proof(status: dict[str, Any]) -> str:
    """The outcome and what the program reported (its stdout, lines joined), for the table."""
    stdout = str(status.get("stdout", ""))
    shown = " | ".join(line.strip() for line in stdout.splitlines()[:12] if line.strip())
    printable = "".join(c if c.isascii() and c.isprintable() else "." for c in shown)
    return f"{observed_text(status)}: {printable}" if printable else observed_text(status)


PRINT_ARGS_THEN_EXEC_HUGE = """\
import os, subprocess, sys
print(len(sys.argv) - 1, sum(len(a) for a in sys.argv[1:]))
try:
    subprocess.run(["true"] + ["a" * 100_000] * 400, check=False)
    print("argv accepted")
except OSError as error:
    print("argv refused", error.strerror)
"""

HUGE_ENVIRONMENT = """\
import os, subprocess
for label, env in [
    ("one 64 MiB variable", {"HUGE": "b" * (64 << 20)}),
    ("20,000 variables of 1 KiB", {f"V{i}": "c" * 1024 for i in range(20_000)}),
]:
    try:
        subprocess.run(["true"], env=env, check=False)
        print(label, "accepted")
    except OSError as error:
        print(label, "refused", error.strerror)
print("env", sorted(k for k in os.environ if k.startswith("KUBERNETES")))
"""

WRITE_OUTSIDE_TMP = f"""\
import os
targets = ["/{MARKER}", "/etc/{MARKER}", "/usr/bin/{MARKER}", "/var/tmp/{MARKER}",
           "/opt/sandpod/{MARKER}", "/sandbox/input/{MARKER}", "/proc/{MARKER}",
           "/sys/{MARKER}", "/dev/{MARKER}", "/tmp/../etc/{MARKER}", "/etc/passwd",
           "/opt/sandpod/bin/sandpod-runner"]
for path in targets:
    try:
        with open(path, "a") as handle:
            handle.write("x")
        print("escaped", path)
    except OSError as error:
        print("denied", path, error.strerror)
# Memory inside the sandbox: allowed, and gone with it.
for path in ["/tmp/{MARKER}", "/dev/shm/{MARKER}"]:
    with open(path, "w") as handle:
        handle.write("x")
print("private writes done")
"""

# A fork bomb that reports how far it got. Every bomb process forks in a loop (the count
# doubles); one refused holds its place and reports the refusal's errno, so the count stays
# where the limit stopped it. The program then counts the tasks (threads, the runner's
# included) of its uid, which is what RLIMIT_NPROC counts, and ends the bomb.
FORK_BOMB_PYTHON = """\
import errno, os, resource, signal, time
def tasks_of(uid):
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as status:
                ids = next(line for line in status if line.startswith("Uid:"))
            if int(ids.split()[1]) == uid:
                count += len(os.listdir(f"/proc/{pid}/task"))
        except (OSError, StopIteration):
            continue
    return count
refused, report = os.pipe()
bomb = os.fork()
if bomb == 0:
    os.setpgid(0, 0)
    while True:
        try:
            os.fork()
        except OSError as error:
            os.write(report, bytes([error.errno]))
            while True:
                time.sleep(60)
print("RLIMIT_NPROC", resource.getrlimit(resource.RLIMIT_NPROC)[0])
print("fork refused", errno.errorcode[os.read(refused, 1)[0]])
print("tasks", tasks_of(os.getuid()), flush=True)
os.killpg(bomb, signal.SIGKILL)
"""

# A bash bomb whose every process forks itself in a loop for good (bash retries a refused
# fork, then moves on to the next). The script watches for the first refusal in the bomb's
# stderr without forking (`[[ -s ]]`, and `read -t` on a FIFO as its clock), then counts the
# tasks in view with a glob of /proc, as the Python bomb does.
FORK_BOMB_BASH = """\
mkfifo /tmp/clock
exec 3<>/tmp/clock
bomb() { while :; do bomb & done; }
bomb 2>/tmp/refusals &
until [[ -s /tmp/refusals ]]; do read -t 0.05 -u 3; done
tasks=(/proc/[0-9]*/task/[0-9]*)
read -r refusal </tmp/refusals
echo "${refusal#*: }"
echo "tasks ${#tasks[@]}"
"""

# Paths through which a container on runc could see the host: what the program gets from each.
PROC_PATHS = """\
import errno, os
def show(path):
    try:
        if os.path.isdir(path):
            return "dir " + " ".join(sorted(os.listdir(path)))
        with open(path, "rb") as handle:
            return "read " + handle.read(200).decode(errors="replace").strip()
    except OSError as error:
        return "denied " + errno.errorcode[error.errno]
for path in ["/proc/version", "/proc/sys/kernel/hostname", "/proc/1/root/etc/hostname",
             "/proc/kcore", "/proc/sysrq-trigger", "/sys/firmware", "/proc/1/environ"]:
    print(path, show(path))
print("processes", len([p for p in os.listdir("/proc") if p.isdigit()]))
"""
# One line per path: gVisor's kernel and the sandbox's hostname; the runner's root and
# environment refused (it is not dumpable); no kcore; sysrq refused; an empty /sys/firmware.
PROC_PATHS_STDOUT = (
    r"\A/proc/version read Linux version \S+-gvisor [^\n]*\n"
    r"/proc/sys/kernel/hostname read sandbox\n"
    r"/proc/1/root/etc/hostname denied EACCES\n"
    r"/proc/kcore denied ENOENT\n"
    r"/proc/sysrq-trigger denied EACCES\n"
    r"/sys/firmware dir \n"
    r"/proc/1/environ denied EACCES\n"
    r"processes 2\n\Z"
)

LEFTOVER_PROCESSES = """\
import os, signal, subprocess, sys, time
# A detached shell, a double-forked daemon and a child that ignores polite signals:
# each would print LEFTOVER after three seconds if it outlived the program.
subprocess.Popen(["sh", "-c", "sleep 3; echo LEFTOVER-SESSION"], start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3)
        print("LEFTOVER-DAEMON", flush=True)
    os._exit(0)
if os.fork() == 0:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    time.sleep(3)
    print("LEFTOVER-STUBBORN", flush=True)
    os._exit(0)
time.sleep(0.5)
print("main done", flush=True)
"""

CASES: tuple[Case, ...] = (
    # --- resources --------------------------------------------------------------------------------
    Case(
        id="fork-bomb-python",
        language="python",
        code=FORK_BOMB_PYTHON,
        # Room for 128 Python processes under gVisor (at 256Mi it is OOMKilled first).
        spec={"timeoutSeconds": 30, "resources": {"memory": "1Gi"}},
        expect=SUCCEEDED,
        why="a doubling fork bomb stops at the platform's process limit (RLIMIT_NPROC, set by "
        "the runner in every sandbox), and the program lives on to say so",
        proof=f"fork refused EAGAIN at {TASKS_IN_VIEW_AT_LIMIT} tasks in view + the pod's "
        f"pause = {PROCESS_LIMIT}",
        stdout_pattern=(
            rf"\ARLIMIT_NPROC {PROCESS_LIMIT}\nfork refused EAGAIN\n{TASKS_IN_VIEW_PATTERN}\Z"
        ),
    ),
    Case(
        id="fork-bomb-bash",
        language="bash",
        code=FORK_BOMB_BASH,
        spec={"timeoutSeconds": 30},
        expect=SUCCEEDED,
        why="a bash bomb (every process forks itself for good) is held at the process limit: "
        "forks are refused there, and the script that started it still runs",
        proof=f"fork refused EAGAIN at {TASKS_IN_VIEW_AT_LIMIT} tasks in view + the pod's "
        f"pause = {PROCESS_LIMIT}",
        stdout_pattern=(
            rf"\Afork: retry: Resource temporarily unavailable\n{TASKS_IN_VIEW_PATTERN}\Z"
        ),
    ),
    Case(
        id="memory-bomb",
        language="python",
        code="chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n",
        spec={"timeoutSeconds": 30, "resources": {"memory": "128Mi"}},
        expect=(("Failed", "OOMKilled"),),
        why="killed at the memory limit, and the status says so",
        proof="OOMKilled by SIGKILL at 128Mi, and the message names the limit",
        message_contains=("128Mi",),
        fields={"signal": 9, "exitCode": ABSENT, "retryable": False},
    ),
    *family(
        {
            "spec": {"timeoutSeconds": 3},
            "expect": TIMED_OUT,
            "min_duration_ms": 3_000,
            "proof": "TimedOut at the 3 s timeout (not before), output so far kept",
        },
        Variant(
            "cpu-spin-past-timeout",
            "python",
            "print('spinning', flush=True)\nwhile True:\n    pass\n",
            "killed at the timeout; output so far is kept",
            {"stdout_equals": "spinning\n", "fields": {"signal": 9}},
        ),
        Variant(
            "sleep-past-timeout",
            "bash",
            "echo sleeping\nsleep 60\necho woke\n",
            "a program that does nothing is killed at the timeout too",
            {"stdout_equals": "sleeping\n"},
        ),
    ),
    Case(
        id="stdout-200mb",
        language="python",
        code=(
            "import sys\nchunk = ('x' * 1023 + '\\n') * 1024\n"
            "for _ in range(200):\n    sys.stdout.write(chunk)\n"
            "sys.stdout.flush()\nprint('END', file=sys.stderr)\n"
        ),
        spec={"timeoutSeconds": 120},
        expect=SUCCEEDED,
        why="the runner keeps the first maxOutputBytes, counts the rest; the status keeps a tail",
        proof="Succeeded, stdout truncated (flagged), stderr whole",
        stdout_pattern=r"\A[x\n]+\Z",
        stderr_equals="END\n",
        fields={"stdoutTruncated": True, "stderrTruncated": False},
    ),
    *family(
        {"expect": SUCCEEDED, "proof": "ENOSPC at /tmp's 128 MiB, reported by the program"},
        Variant(
            "fill-tmp",
            "python",
            (
                "total = 0\ntry:\n"
                "    for i in range(6):\n"
                "        with open(f'/tmp/fill{i}', 'wb') as f:\n"
                "            for _ in range(50):\n"
                "                f.write(b'\\0' * (1 << 20))\n                total += 1\n"
                "                f.flush()\n"
                "    print('wrote', total, 'MiB', flush=True)\n"
                "except OSError as error:\n"
                "    print('stopped at', total, 'MiB:', error, flush=True)\n"
            ),
            "300 MiB into a 128 MiB /tmp: the write fails in the program at once (ENOSPC)",
            {"stdout_contains": ("stopped at 12", "No space left on device")},
        ),
        Variant(
            "fill-tmp-dd",
            "bash",
            # Two files: one alone would meet RLIMIT_FSIZE (100 MiB) before /tmp's size.
            "for f in a b; do dd if=/dev/zero of=/tmp/$f bs=1M count=90 2>&1; done\n"
            "df -k /tmp | tail -n 1\n",
            "dd past /tmp's size: ENOSPC at 128 MiB, /tmp full, nothing more written",
            {"stdout_contains": ("No space left on device", "131072")},
        ),
        Variant(
            "fill-tmp-node",
            "javascript",
            (
                "const fs = require('fs');\nconst chunk = Buffer.alloc(1 << 20);\nlet total = 0;\n"
                "try {\n  for (const name of ['a', 'b']) {\n"
                "    const fd = fs.openSync('/tmp/' + name, 'w');\n"
                "    for (let i = 0; i < 90; i++) { fs.writeSync(fd, chunk); total++; }\n  }\n"
                "  console.log('wrote', total);\n} catch (error) {\n"
                "  console.log('stopped at', total, error.code);\n}\n"
            ),
            "Node.js writing past /tmp's size gets ENOSPC at once",
            {"stdout_contains": ("stopped at 12", "ENOSPC")},
        ),
    ),
    # --- the filesystem and secrets ---------------------------------------------------------------
    Case(
        id="write-outside-tmp",
        language="python",
        code=WRITE_OUTSIDE_TMP,
        expect=SUCCEEDED,
        why="every path outside /tmp is read-only or forbidden; nothing reaches the host",
        proof="each of 12 writes refused, by path; no marker on the host",
        stdout_contains=("private writes done",),
        stdout_excludes=("escaped",),
        stdout_pattern=r"\A(denied [^\n]+\n){12}private writes done\n\Z",
    ),
    Case(
        id="service-account-token",
        language="bash",
        code=(
            "for f in /var/run/secrets/kubernetes.io/serviceaccount/token "
            "/run/secrets/kubernetes.io/serviceaccount/token; do\n"
            '  if [ -e "$f" ]; then echo "FOUND $f"; cat "$f"; else echo "absent $f"; fi\n'
            "done\n"
            "found=$(find / -xdev -path '*serviceaccount*' -name token 2>/dev/null | wc -l)\n"
            'echo "token files: $found"\n'
            'echo "kubernetes vars: $(env | grep -c ^KUBERNETES_)"\n'
        ),
        expect=SUCCEEDED,
        why="no service account token is mounted anywhere, and the program's env is clean",
        proof="no token file at either path or anywhere, no KUBERNETES_ variable",
        stdout_equals=(
            "absent /var/run/secrets/kubernetes.io/serviceaccount/token\n"
            "absent /run/secrets/kubernetes.io/serviceaccount/token\n"
            "token files: 0\nkubernetes vars: 0\n"
        ),
    ),
    Case(
        id="host-files-through-proc",
        language="python",
        code=PROC_PATHS,
        expect=SUCCEEDED,
        why="/proc and /sys are gVisor's: its kernel, its hostname, its few processes; the "
        "runner's root, environment and the host's memory and sysrq are out of reach",
        proof="each of 7 paths: gVisor's own data or refused (one line each, exact)",
        stdout_pattern=PROC_PATHS_STDOUT,
        stdout_excludes=("{host_kernel}",),
    ),
    # --- the network ------------------------------------------------------------------------------
    blocked_probe(
        "kubernetes-api-by-ip",
        ["{api_service}", "{api_endpoint}", "{node_ip}:10250"],
        "the API server (its Service address and the endpoint behind it) and the kubelet, "
        "all reachable from a pod without the policy, are out of reach",
    ),
    Case(
        id="kubernetes-api-by-name",
        language="python",
        code=(
            "import socket\n"
            "for name in ['kubernetes.default.svc.cluster.local', 'kubernetes.default']:\n"
            "    try:\n"
            "        socket.create_connection((name, 443), timeout=3).close()\n"
            "        print('open', name)\n"
            "    except OSError as error:\n"
            "        print('blocked', name, type(error).__name__)\n"
        ),
        expect=SUCCEEDED,
        why="cluster names, which lead to the API server from a pod without the policy, do "
        "not even resolve in a sandbox",
        proof="2 names open without the policy; neither resolves in the sandbox",
        stdout_pattern=r"\A(blocked \S+ gaierror\n){2}\Z",
        policy_free_stdout=all_open(2),
    ),
    Case(
        id="dns-lookups",
        language="python",
        code=DNS_QUERY,
        spec={"args": ["{dns_service}", "{node_ip}"]},
        expect=SUCCEEDED,
        why="no DNS at all: the DNS Service and CoreDNS on the node answer a pod without the "
        "policy, never a sandbox",
        proof="4 answers without the policy; no answer and no resolution in the sandbox",
        stdout_pattern=(
            rf"\A(no-answer (udp|tcp) \S+ {NOT_CONNECTED}\n){{4}}no-resolution gaierror\n\Z"
        ),
        policy_free_stdout=r"\A(answered (udp|tcp) \S+\n){4}resolved \S+\n\Z",
    ),
    blocked_probe(
        "another-pod",
        ["{peer_ip}:{peer_port}"],
        "a pod that a pod without the policy reaches is unreachable from a sandbox",
    ),
    blocked_probe(
        "egress-public-address",
        ["{public_ip}:{fake_port}"],
        "a (fake, local) public host that a pod without the policy reaches is unreachable",
    ),
    blocked_probe(
        "cloud-metadata",
        ["{metadata_ip}:{fake_port}"],
        "a (fake, local) 169.254.169.254 that a pod without the policy reaches is unreachable",
    ),
    Case(
        id="raw-sockets",
        language="python",
        code=(
            "import errno, socket\n"
            "for family, kind, proto, name in [\n"
            "    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, 'inet-raw-icmp'),\n"
            "    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW, 'inet-raw'),\n"
            "    (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP, 'inet-raw-tcp'),\n"
            "    (socket.AF_PACKET, socket.SOCK_RAW, 0, 'packet-raw'),\n"
            "    (socket.AF_PACKET, socket.SOCK_DGRAM, 0, 'packet-dgram'),\n"
            "]:\n"
            "    try:\n"
            "        socket.socket(family, kind, proto).close()\n"
            "        print(name, 'ok')\n"
            "    except OSError as error:\n"
            "        print(name, errno.errorcode[error.errno])\n"
        ),
        expect=SUCCEEDED,
        why="no CAP_NET_RAW: raw and packet sockets are refused",
        proof="each of 5 raw or packet sockets refused EPERM",
        stdout_equals=(
            "inet-raw-icmp EPERM\ninet-raw EPERM\ninet-raw-tcp EPERM\n"
            "packet-raw EPERM\npacket-dgram EPERM\n"
        ),
    ),
    # --- privileges -------------------------------------------------------------------------------
    syscall_case(
        "setuid",
        (
            "report('setuid 0', libc.setuid(0))\nreport('setgid 0', libc.setgid(0))\n"
            "report('setresuid 0', libc.setresuid(0, 0, 0))\n"
            "report('setgroups', libc.setgroups(0, None))\n"
            "import os\nprint('uid', os.getuid(), os.geteuid(), os.getgid())\n"
        ),
        "no way to become root: every attempt is EPERM and the ids do not change",
        (
            "setuid 0 EPERM\nsetgid 0 EPERM\nsetresuid 0 EPERM\nsetgroups EPERM\n"
            "uid 65532 65532 65532\n"
        ),
    ),
    syscall_case(
        "mount",
        (
            "report('mount tmpfs', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
            "report('mount proc', libc.mount(b'proc', b'/tmp', b'proc', 0, None))\n"
            "report('remount rw', libc.mount(None, b'/', None, 0x20 | 0x1000, None))\n"
            "report('umount /sandbox/input', libc.umount2(b'/sandbox/input', 0))\n"
            "report('chroot', libc.chroot(b'/tmp'))\n"
            "report('pivot_root', libc.syscall(155, b'/tmp', b'/tmp'))\n"
        ),
        "no mount, remount, umount, chroot or pivot_root: all EPERM",
        (
            "mount tmpfs EPERM\nmount proc EPERM\nremount rw EPERM\n"
            "umount /sandbox/input EPERM\nchroot EPERM\npivot_root EPERM\n"
        ),
    ),
    syscall_case(
        "ptrace",
        (
            "PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206\n"
            "report('attach runner', libc.ptrace(PTRACE_ATTACH, 1, None, None))\n"
            "report('seize runner', libc.ptrace(PTRACE_SEIZE, 1, None, None))\n"
            "import os\n"
            "try:\n"
            "    os.open('/proc/1/mem', os.O_RDWR)\n    print('runner memory open')\n"
            "except OSError as error:\n    print('runner memory', errno.errorcode[error.errno])\n"
        ),
        "the program cannot trace or patch the runner (PID 1)",
        "attach runner EPERM\nseize runner EPERM\nrunner memory EACCES\n",
    ),
    syscall_case(
        "unshare",
        (
            "for name, flag in [('mnt', 0x20000), ('net', 0x40000000), ('pid', 0x20000000),"
            " ('uts', 0x4000000), ('ipc', 0x8000000)]:\n"
            "    report(f'unshare {name}', libc.unshare(flag))\n"
            "import os\n"
            "for name in ['net', 'mnt', 'pid']:\n"
            "    namespace = os.open(f'/proc/1/ns/{name}', os.O_RDONLY)\n"
            "    report(f'setns {name}', libc.setns(namespace, 0))\n"
            "report('unshare user', libc.unshare(0x10000000))\n"
            "print('ids', os.getuid(), os.geteuid())\n"
            "report('mount on /etc', libc.mount(b'none', b'/etc', b'tmpfs', 0, None))\n"
            "report('sethostname', libc.sethostname(b'evil', 4))\n"
        ),
        "the runner's filter refuses every new namespace, user namespaces included, and setns",
        (
            "unshare mnt EPERM\nunshare net EPERM\nunshare pid EPERM\nunshare uts EPERM\n"
            "unshare ipc EPERM\nsetns net EPERM\nsetns mnt EPERM\nsetns pid EPERM\n"
            "unshare user EPERM\nids 65532 65532\nmount on /etc EPERM\nsethostname EPERM\n"
        ),
    ),
    # --- the runner and process lifetime ----------------------------------------------------------
    Case(
        id="kill-the-runner",
        language="bash",
        code="echo before\nsleep 1\nkill -9 1\necho after-kill\nsleep 1\n",
        expect=SUCCEEDED,
        why="the runner's seccomp filter refuses signals aimed at it (PID 1, same user): the "
        "program carries on and its result is the runner's",
        proof="kill -9 1 refused EPERM, the program carries on, Succeeded",
        stdout_equals="before\nafter-kill\n",
        stderr_contains=("Operation not permitted",),
    ),
    Case(
        id="terminate-the-runner",
        language="bash",
        code="echo before\nkill -TERM 1\nsleep 1\necho after-term\n",
        expect=SUCCEEDED,
        why="SIGTERM to the runner is refused as well: only the platform stops a run",
        proof="kill -TERM 1 refused EPERM, the program carries on, Succeeded",
        stderr_contains=("Operation not permitted",),
        stdout_equals="before\nafter-term\n",
    ),
    Case(
        id="processes-left-running",
        language="python",
        code=LEFTOVER_PROCESSES,
        expect=SUCCEEDED,
        why="everything the program started dies with it; nothing prints afterwards",
        proof="stdout is only 'main done': no leftover (3 of them) ever printed",
        stdout_equals="main done\n",
    ),
    Case(
        id="huge-argv",
        language="python",
        code=PRINT_ARGS_THEN_EXEC_HUGE,
        spec={"args": ["z" * 4096] * 64},
        expect=SUCCEEDED,
        why="the largest argv the spec allows arrives whole; a 40 MB argv is refused",
        proof="64 args of 262144 bytes arrive; the 40 MB argv refused",
        stdout_contains=("64 262144\n", "argv refused"),
    ),
    Case(
        id="huge-environment",
        language="python",
        code=HUGE_ENVIRONMENT,
        expect=SUCCEEDED,
        why="a 64 MiB environment is refused cleanly; the program's own env has nothing of "
        "the cluster",
        proof="the 64 MiB variable refused; no KUBERNETES_ variable in env",
        stdout_contains=("one 64 MiB variable refused", "env []"),
    ),
    # --- output that is hard to carry -------------------------------------------------------------
    Case(
        id="not-utf8",
        language="python",
        code=(
            "import sys\n"
            "sys.stdout.buffer.write(b'before \\xff\\xfe\\xc3( after\\n')\n"
            "sys.stdout.buffer.write('snow \\u2603 split: '.encode() + b'\\xe2\\x98')\n"
            "sys.stdout.flush()\n"
            "sys.stdout.buffer.write(b'\\x83 end\\n')\n"
            "sys.stderr.buffer.write(b'err \\x80\\n')\n"
        ),
        expect=SUCCEEDED,
        why="invalid bytes become U+FFFD; a character split across writes stays whole",
        proof="stdout and stderr exactly, with U+FFFD for invalid bytes",
        stdout_equals="before \ufffd\ufffd\ufffd( after\nsnow \u2603 split: \u2603 end\n",
        stderr_equals="err \ufffd\n",
    ),
    Case(
        id="binary-output",
        language="python",
        code=(
            "import os, sys\n"
            "sys.stdout.buffer.write(bytes(range(256)) * 64 + os.urandom(100_000))\n"
            "sys.stdout.flush()\n"
            "print('done', file=sys.stderr)\n"
        ),
        expect=SUCCEEDED,
        why="binary stdout is carried as text (U+FFFD for what is not UTF-8), NULs included",
        proof="Succeeded, stdout carried with U+FFFD, stderr exactly 'done'",
        stdout_contains=("\ufffd",),
        stderr_equals="done\n",
    ),
    Case(
        id="one-50mb-line",
        language="python",
        code=(
            "import sys\nsys.stdout.write('y' * (50 << 20))\nsys.stdout.write('\\nTAIL\\n')\n"
            "sys.stdout.flush()\nprint('done', file=sys.stderr)\n"
        ),
        spec={"timeoutSeconds": 60},
        expect=SUCCEEDED,
        why="a line far beyond the cap is cut at maxOutputBytes without breaking the log",
        proof="Succeeded, stdout only 'y's and truncated (flagged), stderr 'done'",
        stdout_pattern=r"\Ay+\Z",
        stderr_equals="done\n",
        fields={"stdoutTruncated": True},
    ),
)

NEIGHBOUR_SOURCE = (
    "import time\ntotal = sum(i * i for i in range(200_000))\ntime.sleep(1)\nprint(total)\n"
)
NEIGHBOUR_STDOUT = f"{sum(i * i for i in range(200_000))}\n"
