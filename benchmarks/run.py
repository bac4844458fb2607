#!/usr/bin/env python3
"""sandpod's benchmark (`make bench`); `benchmarks/run.py --help` lists the options. It needs
the project with its bench extra and the test-support package installed (`make bench` sees
to both: pip install -e '.[dev,bench]' -e tests/support)."""

import sys

from sandpod_bench.main import main

if __name__ == "__main__":
    sys.exit(main())
