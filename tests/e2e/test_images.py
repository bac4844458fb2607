"""The sandbox images on the cluster, without the operator.

Each test writes a ConfigMap the way docs/runner-protocol.md says the operator
does, starts a hardened gVisor pod on one of the language images (built and
imported by `make images`), waits for it to end and reads the runner's framed
pod log and the termination message.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from typing import Any

import pytest
from kube_helpers import hardened_pod, wait_for_pod
from kubernetes import client
from sandpod_contract.catalog import load_catalog
from sandpod_contract.runner import LogReader, parse_summary
from sandpod_testkit.paths import REPO_ROOT

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
RUNNER = "/opt/sandpod/bin/sandpod-runner"
INPUT_DIR = "/sandbox/input"
POD_TIMEOUT_SECONDS = 180
# Waiting reasons that mean the pod will never run: fail at once with them.
STUCK_REASONS = {
    "ErrImageNeverPull",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


@dataclass(frozen=True)
class Language:
    image: str
    source_file: str
    command: list[str]
    env: dict[str, str]


CATALOG = load_catalog()


def catalog_language(name: str) -> Language:
    """How the catalog runs `name`, with its image's short name."""
    entry = CATALOG.languages[name]
    image = entry.image.removeprefix("localhost/sandpod/").partition(":")[0]
    return Language(image, entry.file, entry.command, entry.env)


# The interpreted languages (go and csharp need a compile step: test_compiled_languages.py).
INTERPRETED = ("python", "javascript", "typescript", "bash")
LANGUAGES = {name: catalog_language(name) for name in INTERPRETED}
LINT_COMMAND = CATALOG.languages["python"].lint_command

HELLO_PROGRAMS = {
    "python": 'import sys\nprint("hello from python")\n'
    'print("oops from python", file=sys.stderr)\nsys.exit(3)\n',
    "javascript": 'console.log("hello from javascript");\n'
    'console.error("oops from javascript");\nprocess.exitCode = 3;\n',
    "typescript": "interface Greeting { text: string }\n"
    'const greeting: Greeting = { text: "hello from typescript" };\n'
    "console.log(greeting.text);\n"
    'console.error("oops from typescript");\n'
    "process.exitCode = 3 as number;\n",
    "bash": 'echo "hello from bash"\necho "oops from bash" >&2\nexit 3\n',
}


@dataclass(frozen=True)
class Run:
    phase: str
    stdout: str
    stderr: str
    result: dict[str, Any]
    termination: dict[str, Any]
    container_exit_code: int


def run_config(language: Language, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "mode": "run",
        "sourceFile": language.source_file,
        "command": language.command,
        "args": [],
        "env": language.env,
        "timeoutSeconds": 20,
        "maxOutputBytes": 1 << 20,
        "files": [],
        "hasStdin": False,
        "limits": {"processes": 128, "fileSizeBytes": 100 << 20, "openFiles": 1024},
    }
    config.update(overrides)
    return config


def sandbox_pod(name: str, image: str, config_map: str, timeout_seconds: int) -> client.V1Pod:
    """A pod hardened as the operator's sandbox pods are, running the runner on its input."""
    runner = client.V1Container(
        name="runner",
        image=f"localhost/sandpod/{image}:{VERSION}",
        image_pull_policy="Never",
        command=[RUNNER, f"{INPUT_DIR}/config.json"],
        termination_message_policy="File",
        resources=client.V1ResourceRequirements(
            limits={"cpu": "1", "memory": "512Mi", "ephemeral-storage": "256Mi"},
            requests={"cpu": "100m", "memory": "64Mi"},
        ),
        volume_mounts=[
            client.V1VolumeMount(name="input", mount_path=INPUT_DIR, read_only=True),
            client.V1VolumeMount(name="tmp", mount_path="/tmp"),
        ],
    )
    volumes = [
        client.V1Volume(name="input", config_map=client.V1ConfigMapVolumeSource(name=config_map)),
        client.V1Volume(name="tmp", empty_dir=client.V1EmptyDirVolumeSource(size_limit="128Mi")),
    ]
    return hardened_pod(
        name,
        {"app.kubernetes.io/name": "sandpod-test"},
        runner,
        volumes=volumes,
        active_deadline_seconds=timeout_seconds + 60,
    )


def finished_or_stuck(pod: client.V1Pod) -> bool:
    if pod.status is None:
        return False
    if pod.status.phase in {"Succeeded", "Failed"}:
        return True
    for status in pod.status.container_statuses or []:
        waiting = status.state.waiting if status.state else None
        if waiting is not None and (waiting.reason or "") in STUCK_REASONS:
            return True
    return False


def verified_output(log: str, termination_message: str) -> tuple[str, str, dict[str, Any]]:
    """stdout, stderr and the result, through the operator's own decoder: only frames whose MAC
    verifies under the summary's key count."""
    summary = parse_summary(termination_message)
    assert summary is not None, f"the termination message is not a summary: {termination_message}"
    reader = LogReader(tail_bytes=64 * 1024 * 1024, summary=summary)
    reader.feed(log.encode())
    verified = reader.finish()
    assert verified.result is not None, "the log's summary does not verify"
    assert verified.dropped_lines == 0 and verified.missing_frames == 0
    result = verified.result.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return verified.stdout, verified.stderr, result


def run_in_sandbox(
    core_v1: client.CoreV1Api,
    namespace: str,
    name: str,
    language: Language,
    source: str,
    **config_overrides: Any,
) -> Run:
    config = run_config(language, **config_overrides)
    core_v1.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name),
            data={"config.json": json.dumps(config), "source": source},
        ),
    )
    core_v1.create_namespaced_pod(
        namespace, sandbox_pod(name, language.image, name, config["timeoutSeconds"])
    )
    pod = wait_for_pod(
        core_v1,
        namespace,
        name,
        until=finished_or_stuck,
        timeout=POD_TIMEOUT_SECONDS,
        what="to finish",
    )
    assert pod.status is not None and pod.status.container_statuses
    state = pod.status.container_statuses[0].state
    terminated = state.terminated if state else None
    assert terminated is not None, (
        f"pod {name} did not run: {state.waiting if state else None} "
        "(are the images built and imported? run `make images`)"
    )
    assert terminated.message, f"pod {name} left no termination message"
    stdout, stderr, result = verified_output(
        core_v1.read_namespaced_pod_log(name, namespace, container="runner"), terminated.message
    )
    return Run(
        phase=pod.status.phase or "",
        stdout=stdout,
        stderr=stderr,
        result=result,
        termination=json.loads(terminated.message)["result"],
        container_exit_code=terminated.exit_code,
    )


@pytest.mark.parametrize("language_name", sorted(HELLO_PROGRAMS))
def test_hello_world_keeps_stdout_stderr_and_exit_code_apart(
    core_v1: client.CoreV1Api, namespace: str, language_name: str
) -> None:
    run = run_in_sandbox(
        core_v1, namespace, "hello", LANGUAGES[language_name], HELLO_PROGRAMS[language_name]
    )

    assert run.stdout == f"hello from {language_name}\n"
    assert run.stderr == f"oops from {language_name}\n"
    assert run.result["exitCode"] == 3
    assert run.result["error"] is None
    assert run.result["timedOut"] is False
    assert run.termination == run.result
    assert run.container_exit_code == 0  # the runner reported: the program's 3 is in result
    assert run.phase == "Succeeded"  # the pod ran the runner to its report


def test_python_imports_numpy_and_pandas(core_v1: client.CoreV1Api, namespace: str) -> None:
    source = (
        "import numpy as np\n"
        "import pandas as pd\n"
        "frame = pd.DataFrame({'x': np.arange(1, 5)})\n"
        "print(int(frame['x'].sum()))\n"
    )
    run = run_in_sandbox(core_v1, namespace, "numpy", LANGUAGES["python"], source)

    assert run.stderr == ""
    assert run.stdout == "10\n"
    assert run.result["exitCode"] == 0
    assert run.phase == "Succeeded"


def test_python_lint_mode_reports_unused_import(core_v1: client.CoreV1Api, namespace: str) -> None:
    run = run_in_sandbox(
        core_v1,
        namespace,
        "lint",
        LANGUAGES["python"],
        "import os\n",
        mode="lint",
        lintCommand=LINT_COMMAND,
    )

    diagnostics = run.result["diagnostics"]
    assert isinstance(diagnostics, list)
    assert {"code": "F401", "line": 1, "column": 8} in [
        {key: diagnostic[key] for key in ("code", "line", "column")} for diagnostic in diagnostics
    ]
    assert run.result["error"] is None


def test_python_lint_with_the_catalogs_rules_finds_what_the_defaults_miss(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    python = load_catalog().languages["python"]
    assert python.lint_command is not None and python.lint_rules is not None
    run = run_in_sandbox(
        core_v1,
        namespace,
        "lint-rules",
        LANGUAGES["python"],
        "if x == None:\n\tpass\n",
        mode="lint",
        lintCommand=[*python.lint_command, *python.lint_rules.arguments()],
    )

    codes = {diagnostic["code"] for diagnostic in run.result["diagnostics"]}
    assert {"E711", "W191", "F821"} <= codes, codes
    assert run.result["error"] is None


def test_python_reports_its_trailing_expressions_value(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    source = "x = 6\nprint('out')\nx * 7\n"
    run = run_in_sandbox(core_v1, namespace, "value", LANGUAGES["python"], source)

    assert (run.stdout, run.stderr, run.result["exitCode"]) == ("out\n", "", 0)
    assert run.result["value"] == "42"
    assert run.termination["value"] == "42"


def test_child_ignoring_sigterm_is_killed_at_the_timeout(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    source = (
        "import signal, subprocess, sys, time\n"
        "ignore_term = 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
        "subprocess.Popen([sys.executable, '-c', ignore_term], start_new_session=True)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    run = run_in_sandbox(
        core_v1, namespace, "timeout", LANGUAGES["python"], source, timeoutSeconds=3
    )

    assert run.stdout == "started\n"
    assert run.result["timedOut"] is True
    assert run.result["exitCode"] is None
    assert run.result["durationMs"] >= 2900
    assert run.container_exit_code == 0  # the runner reported the timeout
    assert run.termination["timedOut"] is True


def test_output_flood_is_cut_at_the_cap_and_flagged(
    core_v1: client.CoreV1Api, namespace: str
) -> None:
    flood_bytes = 5_000_000
    cap = 4096
    source = f"import sys\nsys.stdout.write('x' * {flood_bytes})\nprint('done', file=sys.stderr)\n"
    run = run_in_sandbox(
        core_v1, namespace, "flood", LANGUAGES["python"], source, maxOutputBytes=cap
    )

    assert run.stdout == "x" * cap
    assert run.result["stdoutTruncated"] is True
    assert run.result["stdoutBytes"] == flood_bytes
    assert run.stderr == "done\n"
    assert run.result["stderrTruncated"] is False
    assert run.result["exitCode"] == 0
