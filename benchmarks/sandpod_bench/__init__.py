"""sandpod's benchmark: latency, throughput, baselines, time breakdown and operator cost.

Run it with `make bench` or `python benchmarks/run.py --help`.
"""
