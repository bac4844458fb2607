"""The egress proxy's added latency: a 1 MB download through it vs directly, in one sandbox.

One CodeExecution whose allowlist names both the host (through the proxy) and its address as a
CIDR (direct), so both paths run in the same sandbox, interleaved, in the same run; with
--https-port also over HTTPS (through the proxy: CONNECT, then Squid peeks at the TLS server
name and splices; the client does not verify the test host's certificate):

    python benchmarks/proxy_latency.py --namespace NS --host allowed.fake --address 203.0.113.20 \
        --port 8080 [--https-port 8443] --path /big.bin [--rounds 20] [--output result.json]

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

# Alternates the paths (name, URL, through the proxy or not); prints {name: [ms...]}.
PROGRAM = """
import json, ssl, sys, time, urllib.request
paths, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
unverified = ssl.create_default_context()
unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
tls = urllib.request.HTTPSHandler(context=unverified)
openers = {
    True: urllib.request.build_opener(tls),
    False: urllib.request.build_opener(urllib.request.ProxyHandler({}), tls),
}
samples = {name: [] for name, _, _ in paths}
for _ in range(rounds + 1):  # the first round warms up and is dropped
    for name, url, proxied in paths:
        started = time.perf_counter()
        with openers[proxied].open(url, timeout=30) as answer:
            size = len(answer.read())
        assert size >= 1024 * 1024, size
        samples[name].append((time.perf_counter() - started) * 1000)
print(json.dumps({name: values[1:] for name, values in samples.items()}))
"""


def execution_spec(
    host: str, address: str, port: int, path: str, rounds: int, https_port: int | None = None
) -> dict[str, Any]:
    paths = [
        ("direct", f"http://{address}:{port}{path}", False),
        ("proxied", f"http://{host}:{port}{path}", True),
    ]
    ports = [port]
    if https_port is not None:
        paths += [
            ("direct_https", f"https://{address}:{https_port}{path}", False),
            ("proxied_https", f"https://{host}:{https_port}{path}", True),
        ]
        ports.append(https_port)
    opened = [{"port": p} for p in ports]
    return {
        "language": "python",
        "source": PROGRAM,
        "args": [json.dumps(paths), str(rounds)],
        "timeoutSeconds": 120,
        "resources": {"memory": "256Mi", "cpu": "1"},
        "network": {
            "egress": "allowlist",
            "allow": [{"cidr": f"{address}/32", "ports": opened}, {"host": host, "ports": opened}],
        },
    }


def report(samples: dict[str, list[float]]) -> dict[str, Any]:
    """p50/p95 of each path and the proxy's added p50 in milliseconds (per scheme)."""
    summaries = {name: summarize(values) for name, values in samples.items()}
    result: dict[str, Any] = {
        name: None if summary is None else {"p50_ms": summary.p50, "p95_ms": summary.p95}
        for name, summary in summaries.items()
    }
    for suffix in ("", "_https"):
        direct, proxied = summaries.get(f"direct{suffix}"), summaries.get(f"proxied{suffix}")
        if direct is not None and proxied is not None:
            result[f"added_p50_ms{suffix}"] = proxied.p50 - direct.p50
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
    parser.add_argument("--https-port", type=int)
    parser.add_argument("--path", default="/big.bin")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    config.load_kube_config()
    spec = execution_spec(
        args.host, args.address, args.port, args.path, args.rounds, args.https_port
    )
    result = report(measure(client.CustomObjectsApi(), args.namespace, spec))
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
