#!/usr/bin/env python3
"""sandpod's benchmark (`make bench`); `benchmarks/run.py --help` lists the options."""

import sys

from sandpod_bench.main import main

if __name__ == "__main__":
    sys.exit(main())
