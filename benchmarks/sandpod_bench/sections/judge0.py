"""Section `judge0`: a class's batch through Judge0's API, cold and from pools. One POST
/judge0/submissions/batch of 100 submissions (20 wrong answers, 10 time limits, 5 build
failures, the rest accepted: python and go), into a tenant that runs JUDGE0_MAX_CONCURRENT at
once (the rest wait in its queue, Judge0's In Queue); polled with GET /submissions/batch until
every verdict is in. Measured: the batch's time to its last verdict, submissions per second,
time to each verdict (p50/p99 from the POST), and whether every verdict is right. Cold: no
pool in the tenant's namespace; pool: SandboxPools of python and go there (a go sandbox builds
its submission when claimed), filled first; then a batch of Python only from the same pools."""

from __future__ import annotations

import time
from typing import Any

import httpx
from sandpod_contract.names import GROUP, POOL_PLURAL, VERSION

from sandpod_bench import manifests
from sandpod_bench.bench import JUDGE0_MAX_CONCURRENT, Bench
from sandpod_bench.cluster import progress
from sandpod_bench.stats import summarize

BATCH_SIZE = 100
POOL_SIZE = 4
# Beside the python pool: the go submissions' (each claimed sandbox builds its source).
GO_POOL_SIZE = 2
POOL_FILL_SECONDS = 300
BATCH_TIMEOUT_SECONDS = 900
POLL_SECONDS = 0.5
# Judge0 1.13.1's ids and statuses.
PYTHON, GO = 71, 60
ACCEPTED, WRONG_ANSWER, TIME_LIMIT, COMPILATION_ERROR = 3, 4, 5, 6
DONE_AFTER = 2  # 1 In Queue, 2 Processing

SUM = "a, b = map(int, input().split())\nprint(a + b)\n"
GO_SUM = (
    'package main\n\nimport "fmt"\n\nfunc main() {\n'
    "\tvar a, b int\n\tfmt.Scan(&a, &b)\n\tfmt.Println(a + b)\n}\n"
)


def python_batch() -> list[tuple[dict[str, Any], int]]:
    """A class's batch in Python only: 20 wrong answers, 80 accepted."""
    accepted = {"source_code": SUM, "language_id": PYTHON, "stdin": "2 3", "expected_output": "5"}
    wrong = {**accepted, "expected_output": "6"}
    return [(wrong, WRONG_ANSWER) if i % 5 == 0 else (accepted, ACCEPTED) for i in range(100)]


def class_batch() -> list[tuple[dict[str, Any], int]]:
    """The batch's submissions, each with the verdict it must get, interleaved as students
    send them: 20 wrong answers, 10 time limits, 5 build failures (go), 65 accepted (10 go)."""
    accepted = {"source_code": SUM, "language_id": PYTHON, "stdin": "2 3", "expected_output": "5"}
    kinds: list[tuple[dict[str, Any], int, int]] = [
        ({**accepted, "expected_output": "6"}, WRONG_ANSWER, 20),
        (
            {
                "source_code": "while True: pass\n",
                "language_id": PYTHON,
                "cpu_time_limit": 1,
                "wall_time_limit": 2,
            },
            TIME_LIMIT,
            10,
        ),
        (
            {"source_code": "package main\nfunc main() { x }\n", "language_id": GO},
            COMPILATION_ERROR,
            5,
        ),
        ({**accepted, "source_code": GO_SUM, "language_id": GO}, ACCEPTED, 10),
    ]
    kinds.append((accepted, ACCEPTED, BATCH_SIZE - sum(count for _, _, count in kinds)))
    # Each kind spread evenly over the batch: entry i of n at (i + 0.5) / n.
    spread = [
        ((i + 0.5) / count, fields, verdict)
        for fields, verdict, count in kinds
        for i in range(count)
    ]
    return [(fields, verdict) for _, fields, verdict in sorted(spread, key=lambda e: e[0])]


def run(bench: Bench, cold: httpx.Client, pooled: httpx.Client) -> None:
    results = {"cold": measure_batch(cold, "cold")}
    namespace = bench.namespaces.judge0_pool
    progress(f"judge0: SandboxPools of python ({POOL_SIZE}) and go ({GO_POOL_SIZE}) in {namespace}")
    for language, size in (("python", POOL_SIZE), ("go", GO_POOL_SIZE)):
        pool = manifests.sandbox_pool(f"judge0-{language}", size)
        pool["spec"]["language"] = language
        bench.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POOL_PLURAL, pool)
    if not pools_full(bench, namespace):
        bench.notes.append(f"judge0: the pools were not full after {POOL_FILL_SECONDS} s")
    results["pool"] = measure_batch(pooled, "pool")
    # Every submission from the python pool's sandboxes, many runs each.
    results["python_pool"] = measure_batch(pooled, "python only, pool", python_batch())
    bench.results["judge0"] = results


def pools_full(bench: Bench, namespace: str) -> bool:
    deadline = time.monotonic() + POOL_FILL_SECONDS
    while time.monotonic() < deadline:
        listed: Any = bench.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, POOL_PLURAL
        )
        if all(
            int((p.get("status") or {}).get("ready") or 0) >= p["spec"]["size"]
            for p in listed["items"]
        ):
            return True
        time.sleep(POLL_SECONDS)
    return False


def measure_batch(
    http: httpx.Client, what: str, batch: list[tuple[dict[str, Any], int]] | None = None
) -> dict[str, Any]:
    """The batch (a class's, by default), sent once and polled to its last verdict."""
    batch = batch or class_batch()
    progress(f"judge0 ({what}): a batch of {len(batch)}, {JUDGE0_MAX_CONCURRENT} at once")
    started = time.monotonic()
    answer = http.post(
        "/judge0/submissions/batch", json={"submissions": [fields for fields, _ in batch]}
    )
    answer.raise_for_status()
    tokens = [str(entry["token"]) for entry in answer.json()]
    seconds: dict[str, float] = {}
    verdicts: dict[str, int] = {}
    deadline = started + BATCH_TIMEOUT_SECONDS
    while len(verdicts) < len(tokens) and time.monotonic() < deadline:
        pending = [token for token in tokens if token not in verdicts]
        read = http.get(
            "/judge0/submissions/batch",
            params={"tokens": ",".join(pending), "fields": "token,status_id"},
        )
        read.raise_for_status()
        now = time.monotonic() - started
        for submission in read.json()["submissions"]:
            if submission and submission["status_id"] > DONE_AFTER:
                verdicts[submission["token"]] = submission["status_id"]
                seconds[submission["token"]] = now
        time.sleep(POLL_SECONDS)
    total = max(seconds.values(), default=None)
    wrong = [
        (want, verdicts.get(token))
        for token, (_, want) in zip(tokens, batch, strict=True)
        if verdicts.get(token) != want
    ]
    summary = summarize(list(seconds.values()), failures=len(tokens) - len(seconds))
    entry = {
        "submissions": len(tokens),
        "max_concurrent": JUDGE0_MAX_CONCURRENT,
        "seconds": total,
        "submissions_per_second": len(seconds) / total if total else None,
        "to_verdict": summary.as_dict() if summary else None,
        "wrong_verdicts": len(wrong),
        "wrong_verdict_examples": wrong[:5],
    }
    if summary and total:
        progress(
            f"  {total:.1f}s, {entry['submissions_per_second']:.2f}/s, to verdict p50 "
            f"{summary.p50:.1f}s p99 {summary.p99:.1f}s, {len(wrong)} wrong verdicts"
        )
    return entry
