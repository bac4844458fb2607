"""One module per section of the bench (`--sections`): latency, baselines, throughput, pool
(and pool-throughput), session (and session-throughput), cost. Each has a `run(bench, ...)`."""
