#!/usr/bin/env python3
"""sandpod's benchmark (`make bench`); `benchmarks/run.py --help` lists the options."""

import sys
from pathlib import Path

# The support package the bench shares with the tests (tests/support/sandpod_testkit).
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from sandpod_bench.main import main

if __name__ == "__main__":
    sys.exit(main())
