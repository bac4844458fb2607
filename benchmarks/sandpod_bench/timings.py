"""The operator's timing lines (pure parsing): the milestones of each warm run of the record
path (`warm timings`) and of each direct run (`direct timings`), by (namespace, name), which
the breakdowns put beside what the bench saw itself (same machine, same wall clock)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sandpod_contract.names import DIRECT_TIMINGS_LOG, TIMINGS_LOG

# Prefix of the operator's marks in a timeline (breakdown.WARM_MILESTONES, DIRECT_MILESTONES).
MARK_PREFIX = "op_"
Marks = dict[tuple[str, str], dict[str, float]]


def parse_marks(lines: Iterable[str], kind: str = TIMINGS_LOG) -> Marks:
    """(namespace, name) -> the operator's marks of its run (pure), `op_`-prefixed, from its
    lines of `kind` (TIMINGS_LOG: warm runs of the record path; DIRECT_TIMINGS_LOG)."""
    found: Marks = {}
    for line in lines:
        _, marker, rest = line.partition(kind + " ")
        if not marker:
            continue
        where, _, document = rest.strip().partition(" ")
        namespace, _, name = where.partition("/")
        try:
            marks = json.loads(document)
        except ValueError:
            continue
        if isinstance(marks, dict):
            found[(namespace, name)] = {
                MARK_PREFIX + str(key): float(value)
                for key, value in marks.items()
                if isinstance(value, int | float)
            }
    return found


def operator_marks(log_path: Path, kind: str = TIMINGS_LOG) -> Marks:
    if not log_path.exists():
        return {}
    with log_path.open(errors="replace") as lines:
        return parse_marks(lines, kind)


def direct_marks(log_path: Path) -> Marks:
    return operator_marks(log_path, DIRECT_TIMINGS_LOG)
