"""Files generated from the contract (the CRDs, the chart's copies of contract facts): write
them, or check that the committed ones still hold what the contract says."""

import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], *, check: bool, command: str) -> int:
    """The exit status of a generator: with ``check``, each file that differs from what it
    must hold is named (with ``command``, which writes it again) and the status is 1 if any
    does; without, each such file is written."""
    stale = [path for path, text in files.items() if _read(path) != text]
    if check:
        for path in stale:
            print(f"{path} drifted from the contract: run {command}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path}")
    return 0


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
