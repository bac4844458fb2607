"""CPU time and memory of a process, from /proc (parsing is pure, reading is one function)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessSample:
    cpu_seconds: float  # user + system, this process only (its threads included)
    rss_bytes: int  # resident set now
    peak_rss_bytes: int  # high-water mark of the resident set since the process started


def parse_cpu_seconds(stat_text: str, ticks_per_second: int = CLOCK_TICKS_PER_SECOND) -> float:
    """utime + stime from /proc/<pid>/stat. The command name (field 2) may hold spaces and
    parentheses, so fields are counted from the last ')'."""
    after_name = stat_text[stat_text.rindex(")") + 2 :].split()
    # after_name[0] is field 3 (state); utime and stime are fields 14 and 15.
    utime, stime = int(after_name[11]), int(after_name[12])
    return (utime + stime) / ticks_per_second


def parse_status_kib(status_text: str, key: str) -> int:
    """A `Key:   1234 kB` line of /proc/<pid>/status, in bytes."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            number, _, unit = value.strip().partition(" ")
            if unit != "kB":
                raise ValueError(f"unexpected unit in {line!r}")
            return int(number) * 1024
    raise KeyError(key)


def sample(pid: int, proc: Path = Path("/proc")) -> ProcessSample:
    stat_text = (proc / str(pid) / "stat").read_text()
    status_text = (proc / str(pid) / "status").read_text()
    return ProcessSample(
        cpu_seconds=parse_cpu_seconds(stat_text),
        rss_bytes=parse_status_kib(status_text, "VmRSS"),
        peak_rss_bytes=parse_status_kib(status_text, "VmHWM"),
    )
