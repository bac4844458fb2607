"""The README's language table, measured: per catalog language, its version, image, image
size (as containerd holds it) and the cold time of hello world through kubectl (`kubectl
apply`, then `kubectl wait --for=condition=Completed`; p50 of --runs, one after another,
each a fresh sandbox pod), and the p50 of the runner's own `durationMs` of the program.

Starts its own operator (this checkout's code and catalog) scoped to a namespace of its own,
deletes everything at the end. `--readme` also writes the table into README.md.

    .venv/bin/python benchmarks/languages.py --runs 10 --readme

(with the project and tests/support installed, as `make venv` does).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml
from sandpod_bench.processes import OperatorProcess
from sandpod_bench.stats import percentile
from sandpod_contract.catalog import Catalog, load_catalog
from sandpod_testkit.paths import REPO_ROOT, default_kubeconfig

HELLO = {
    "bash": 'echo "hello, world"\n',
    "csharp": "class Hello {\n    static void Main() {\n"
    '        System.Console.WriteLine("hello, world");\n    }\n}\n',
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello, world")\n}\n',
    "javascript": 'console.log("hello, world");\n',
    "python": 'print("hello, world")\n',
    "typescript": 'const greeting: string = "hello, world";\nconsole.log(greeting);\n',
}
EXPECTED_STDOUT = "hello, world\n"
RUN_TIMEOUT_SECONDS = 120
TABLE_BEGIN, TABLE_END = "<!-- languages:begin -->", "<!-- languages:end -->"
HEADER = (
    "| language | version | image | image size | hello world, cold (p50 of {runs}) "
    "| the program's own time (p50) |\n|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Row:
    language: str
    version: str
    image: str
    image_size: str
    cold_p50_seconds: float
    duration_p50_ms: float


def markdown_table(rows: list[Row], runs: int) -> str:
    lines = [HEADER.format(runs=runs)]
    for row in sorted(rows, key=lambda r: r.language):
        lines.append(
            f"| `{row.language}` | {row.version} | `{row.image}` | {row.image_size} "
            f"| {row.cold_p50_seconds:.1f} s | {row.duration_p50_ms:.0f} ms |"
        )
    return "\n".join(lines)


def with_table(readme: str, table: str) -> str:
    """README text with the table between its markers replaced."""
    head, rest = readme.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{table}\n{TABLE_END}{tail}"


def image_sizes(ctr: str, address: str) -> dict[str, str]:
    """image reference -> size, as `ctr images ls` shows it (the imported content)."""
    listed = subprocess.run(
        [ctr, "--address", address, "--namespace", "k8s.io", "images", "ls"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sizes = {}
    for line in listed.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 5:
            sizes[fields[0]] = f"{fields[3]} {fields[4]}"
    return sizes


@dataclass
class Kubectl:
    binary: str
    kubeconfig: Path
    namespace: str

    def __call__(self, *args: str, stdin: str = "") -> str:
        done = subprocess.run(
            [self.binary, f"--namespace={self.namespace}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={"KUBECONFIG": str(self.kubeconfig), "PATH": "/usr/bin:/bin"},
            timeout=RUN_TIMEOUT_SECONDS + 30,
            check=True,
        )
        return done.stdout

    def hello(self, name: str, language: str) -> tuple[float, int]:
        """One cold run: (seconds from apply to Completed, the runner's durationMs)."""
        manifest = {
            "apiVersion": "sandpod.dev/v1alpha1",
            "kind": "CodeExecution",
            "metadata": {"name": name},
            "spec": {"language": language, "source": HELLO[language], "timeoutSeconds": 60},
        }
        started = time.perf_counter()
        self("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
        self("wait", "--for=condition=Completed", f"cx/{name}", f"--timeout={RUN_TIMEOUT_SECONDS}s")
        seconds = time.perf_counter() - started
        status = json.loads(self("get", f"cx/{name}", "-o", "json"))["status"]
        if status.get("phase") != "Succeeded" or status.get("stdout") != EXPECTED_STDOUT:
            raise RuntimeError(f"{name}: {json.dumps(status)[:2000]}")
        return seconds, int(status["durationMs"])


def measure(kubectl: Kubectl, catalog: Catalog, sizes: dict[str, str], runs: int) -> list[Row]:
    rows = []
    for language in sorted(catalog.languages):
        entry = catalog.languages[language]
        kubectl.hello(f"warmup-{language}", language)  # unmeasured: the node's caches
        samples = [kubectl.hello(f"hello-{language}-{i}", language) for i in range(runs)]
        print(f"{language}: {[round(s, 2) for s, _ in samples]} s", file=sys.stderr)
        rows.append(
            Row(
                language=language,
                version=entry.version,
                image=entry.image,
                image_size=sizes.get(entry.image, "?"),
                cold_p50_seconds=percentile([s for s, _ in samples], 0.5),
                duration_p50_ms=percentile([float(ms) for _, ms in samples], 0.5),
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument(
        "--containerd-address",
        default=os.environ.get(
            "CONTAINERD_ADDRESS", str(REPO_ROOT / ".cluster" / "run" / "containerd.sock")
        ),
    )
    args = parser.parse_args(argv)
    kubeconfig = default_kubeconfig()
    catalog_path = os.environ.get("SANDPOD_CATALOG_PATH")
    catalog = load_catalog(Path(catalog_path)) if catalog_path else load_catalog()
    namespace = f"bench-langs-{uuid.uuid4().hex[:6]}"
    kubectl = Kubectl(args.kubectl, kubeconfig, namespace)
    operator = OperatorProcess(
        kubeconfig=kubeconfig, namespaces=[namespace], log_path=Path(f"/tmp/{namespace}.log")
    )
    kubectl("create", "namespace", namespace)
    operator.start()
    try:
        sizes = image_sizes(shutil.which("ctr") or "ctr", args.containerd_address)
        table = markdown_table(measure(kubectl, catalog, sizes, args.runs), args.runs)
    finally:
        kubectl("delete", "cx", "--all", "--wait=true")
        operator.stop()
        kubectl("delete", "namespace", namespace, "--wait=false")
    print(table)
    if args.readme:
        readme = REPO_ROOT / "README.md"
        readme.write_text(with_table(readme.read_text(), table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
