"""hack/cluster/lib.sh's apt-get, which every script that installs Debian packages runs: it
passes apt's own lock wait, and says it waits when another process holds one of apt's locks.
Run with a stand-in apt-get on PATH and lock files of the test's own."""

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandpod_testkit.paths import REPO_ROOT

LIB = REPO_ROOT / "hack" / "cluster" / "lib.sh"
REFUSAL = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 7 (apt-get)"


@pytest.fixture
def fake_apt(tmp_path: Path) -> Path:
    """A bin directory whose apt-get prints its arguments; it fails as apt does when refused
    a lock as long as the file `refusals` holds a number above 0, counting it down."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(
        "#!/bin/bash\n"
        f"count=$(cat {tmp_path}/refusals 2>/dev/null || echo 0)\n"
        'if [ "$count" -gt 0 ]; then\n'
        f"  echo $((count - 1)) > {tmp_path}/refusals\n"
        f"  echo '{REFUSAL}' >&2\n"
        "  echo 'E: Unable to lock directory /var/lib/apt/lists/' >&2\n"
        "  exit 100\n"
        "fi\n"
        'echo "apt-get $*"\n'
    )
    script.chmod(0o755)
    return bin_dir


def run_apt(fake_apt: Path, locks: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{fake_apt}:{os.environ['PATH']}",
        "APT_LOCK_FILES": " ".join(str(lock) for lock in locks),
        "APT_LOCK_TIMEOUT": "30",
        "SANDPOD_CLUSTER_DIR": str(fake_apt.parent / "cluster"),
    }
    command = f'source "{LIB}"; apt-get "$@"'
    return subprocess.run(
        ["bash", "-c", command, "apt", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Path]:
    """A lock file this process holds a POSIX lock on, as apt holds its own."""
    path = tmp_path / "lock-frontend"
    with path.open("w") as file:
        fcntl.lockf(file, fcntl.LOCK_EX)
        yield path


def test_apt_gets_its_own_lock_wait_and_is_quiet_when_no_lock_is_held(
    fake_apt: Path, tmp_path: Path
) -> None:
    free = tmp_path / "free-lock"
    free.touch()
    result = run_apt(fake_apt, [free, tmp_path / "absent"], "install", "-y", "socat")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("apt-get -o DPkg::Lock::Timeout=")
    assert result.stdout.rstrip().endswith("install -y socat")
    assert result.stderr == ""


def test_apt_says_it_waits_when_another_process_holds_a_lock(
    fake_apt: Path, held_lock: Path
) -> None:
    result = run_apt(fake_apt, [held_lock], "install", "-y", "socat")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert "waiting (up to 30s) for another apt-get or dpkg to let go of its lock" in line
    assert f"its lock: {held_lock}, held by process {os.getpid()} (" in line


def test_a_refused_lists_lock_is_said_once_and_tried_again(fake_apt: Path, tmp_path: Path) -> None:
    """apt's update does not wait for the lists lock itself: refused, it runs again."""
    (tmp_path / "refusals").write_text("1\n")
    result = run_apt(fake_apt, [tmp_path / "absent"], "update", "-qq")
    assert result.returncode == 0, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.endswith(
        "let go of its lock: /var/lib/apt/lists/lock. It is held by process 7 (apt-get)"
    )
    assert result.stdout.rstrip().endswith("update -qq")
