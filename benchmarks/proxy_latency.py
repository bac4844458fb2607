"""The egress proxy's added latency: a 1 MB download through it vs directly, in one sandbox.

One CodeExecution whose allowlist names both the host (through the proxy) and its address as a
CIDR (direct), so both paths run in the same sandbox, interleaved, in the same run:

    python benchmarks/proxy_latency.py --namespace NS --host allowed.fake --address 203.0.113.20 \
        --port 8080 --path /big.bin [--rounds 20] [--output result.json]

Needs an operator configured with the chart's egress proxy serving NS, and a host that the
proxy resolves (tests/hostile/test_egress_by_host_name.py runs it against its fake internet).
"""

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config
from sandpod_bench.stats import summarize
from sandpod_contract.names import GROUP, PLURAL, VERSION

# Alternates direct and proxied downloads; prints {"direct": [ms...], "proxied": [ms...]}.
PROGRAM = """
import json, sys, time, urllib.request
direct_url, proxied_url, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
proxied = urllib.request.build_opener()
samples = {"direct": [], "proxied": []}
for _ in range(rounds + 1):  # the first round warms up and is dropped
    for name, opener, url in (("direct", direct, direct_url), ("proxied", proxied, proxied_url)):
        started = time.perf_counter()
        with opener.open(url, timeout=30) as answer:
            size = len(answer.read())
        assert size >= 1024 * 1024, size
        samples[name].append((time.perf_counter() - started) * 1000)
print(json.dumps({name: values[1:] for name, values in samples.items()}))
"""


def execution_spec(host: str, address: str, port: int, path: str, rounds: int) -> dict[str, Any]:
    return {
        "language": "python",
        "source": PROGRAM,
        "args": [f"http://{address}:{port}{path}", f"http://{host}:{port}{path}", str(rounds)],
        "timeoutSeconds": 120,
        "resources": {"memory": "256Mi", "cpu": "1"},
        "network": {
            "egress": "allowlist",
            "allow": [
                {"cidr": f"{address}/32", "ports": [{"port": port}]},
                {"host": host, "ports": [{"port": port}]},
            ],
        },
    }


def report(samples: dict[str, list[float]]) -> dict[str, Any]:
    """p50/p95 of each path and the proxy's added p50 in milliseconds."""
    summaries = {name: summarize(values) for name, values in samples.items()}
    result: dict[str, Any] = {
        name: None if summary is None else {"p50_ms": summary.p50, "p95_ms": summary.p95}
        for name, summary in summaries.items()
    }
    direct, proxied = summaries.get("direct"), summaries.get("proxied")
    if direct is not None and proxied is not None:
        result["added_p50_ms"] = proxied.p50 - direct.p50
    return result


def measure(objects: client.CustomObjectsApi, namespace: str, spec: dict[str, Any]) -> Any:
    """Runs the execution and returns its samples (raises when it did not succeed)."""
    name = f"proxy-bench-{uuid.uuid4().hex[:6]}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeExecution"}
    body |= {"metadata": {"name": name}, "spec": spec}
    objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    deadline = time.monotonic() + spec["timeoutSeconds"] + 60
    while time.monotonic() < deadline:
        found = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        status = found.get("status") or {}
        if status.get("phase") == "Succeeded":
            return json.loads(status["stdout"])
        if status.get("phase") in ("Failed", "TimedOut", "Error", "Cancelled"):
            raise RuntimeError(f"the benchmark execution ended {status}")
        time.sleep(0.5)
    raise TimeoutError(f"{namespace}/{name} did not finish")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=80)
    parser.add_argument("--path", default="/big.bin")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    config.load_kube_config()
    spec = execution_spec(args.host, args.address, args.port, args.path, args.rounds)
    result = report(measure(client.CustomObjectsApi(), args.namespace, spec))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
