"""Compiled languages (go, csharp): the catalog, the compile step in config.json, the runner's
compile result, the CompilationError verdict and status, the gateway's compile_error, and the
README's language table against the catalog."""

import json
import os
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import runner_wire
from sandpod_contract.catalog import DEFAULT_CATALOG_PATH, load_catalog, run_seconds
from sandpod_contract.models import CodeExecutionSpec, SandboxPoolSpec
from sandpod_contract.runner import LogReader, RunnerResult, parse_summary
from sandpod_gateway.kube.resources import execution_result
from sandpod_gateway.languages import load_language_catalog
from sandpod_gateway.schemas import ExecutionStatus
from sandpod_operator.executions.builders import (
    InvalidSpecError,
    build_pod,
    build_runner_config,
    plan_execution,
)
from sandpod_operator.pools.builders import plan_pool
from sandpod_operator.settings import OperatorSettings
from sandpod_operator.status import Verdict, next_status, observe_pod
from sandpod_testkit.paths import REPO_ROOT

COMPILED = ("csharp", "go")
NOW = datetime(2026, 1, 1, 12, 0, 10, tzinfo=UTC)
GO_ERROR = "./main.go:3:2: undefined: fmt.Printn\n"


CATALOG = load_catalog()


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> OperatorSettings:
    """The defaults, whatever SANDPOD_* variables this shell has."""
    for name in [name for name in os.environ if name.startswith("SANDPOD_")]:
        monkeypatch.delenv(name)
    return OperatorSettings()


def compiled(**fields: Any) -> dict[str, Any]:
    """A compile result as the runner writes it: a build that succeeded, unless `fields`."""
    base = dict(exitCode=0, signal=None, timedOut=False, durationMs=900, output="")
    return {**base, "outputTruncated": False, **fields}


def failed_build(output: str = GO_ERROR, **fields: Any) -> dict[str, Any]:
    return runner_wire.result(
        exitCode=None, durationMs=0, compile=compiled(**{"exitCode": 1, "output": output, **fields})
    )


def finished_pod(runner: dict[str, Any], outputs: list[tuple[str, str]]) -> dict[str, Any]:
    message = runner_wire.termination_message(runner, len(outputs))
    return {
        "metadata": {"name": "cx-pod", "creationTimestamp": "2026-01-01T12:00:00Z"},
        "spec": {"containers": [{"resources": {"limits": {"memory": "256Mi"}}}]},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 0,
                            "reason": "Completed",
                            "message": message,
                            "startedAt": "2026-01-01T12:00:02Z",
                            "finishedAt": "2026-01-01T12:00:04Z",
                        }
                    }
                }
            ],
        },
    }


def observe(
    runner: dict[str, Any], settings: OperatorSettings, outputs: tuple[tuple[str, str], ...] = ()
) -> Verdict:
    """The operator's verdict on a pod whose runner reported `runner` after `outputs`."""
    pod = finished_pod(runner, list(outputs))
    summary = parse_summary(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert summary is not None
    reader = LogReader(64 * 1024, summary)
    reader.feed(runner_wire.pod_log(list(outputs), runner))
    return observe_pod(
        pod, log=reader.finish(), mode="run", timeout_seconds=10, now=NOW, settings=settings
    )


# --- the catalog and config.json ------------------------------------------------------------


@pytest.mark.parametrize("language", COMPILED)
def test_compiled_languages_build_then_run(language: str) -> None:
    entry = CATALOG.languages[language]
    assert entry.compile_command is not None
    assert entry.file in " ".join(entry.compile_command)
    assert entry.version and entry.description


def test_the_go_toolchain_writes_only_under_tmp() -> None:
    env = CATALOG.languages["go"].env
    assert env["GOCACHE"].startswith("/tmp/") and env["GOPATH"].startswith("/tmp/")
    assert env["CGO_ENABLED"] == "0"  # the image's pre-compiled standard library is cgo-free


def test_config_json_carries_the_compile_step_in_run_mode(settings: OperatorSettings) -> None:
    spec = CodeExecutionSpec(language="go", source="package main\nfunc main() {}\n")
    config = build_runner_config(spec, plan_execution(spec, CATALOG, settings), settings)
    assert config["compileCommand"][:2] == ["sh", "-c"]
    assert "/compile -p main" in config["compileCommand"][2]
    assert config["command"] == ["./main"]
    python = CodeExecutionSpec(language="python", source="print(1)")
    assert "compileCommand" not in build_runner_config(
        python, plan_execution(python, CATALOG, settings), settings
    )


@pytest.mark.parametrize("language", COMPILED)
def test_compiled_languages_have_pools_of_run_once_sandboxes(
    settings: OperatorSettings, language: str
) -> None:
    """A claimed sandbox builds its run's source (test_operator_pools.py); a session's runs
    share one sandbox, where nothing builds."""
    plan_pool(SandboxPoolSpec(language=language, size=1), CATALOG, settings)
    with pytest.raises(InvalidSpecError, match=r"spec.language: .* is compiled"):
        plan_pool(SandboxPoolSpec(language=language, size=1, sessions=True), CATALOG, settings)


def test_config_json_carries_the_builds_own_time_limit(settings: OperatorSettings) -> None:
    settings = OperatorSettings(compile_timeout_seconds=45)
    spec = CodeExecutionSpec(language="go", source="package main\nfunc main() {}\n")
    config = build_runner_config(spec, plan_execution(spec, CATALOG, settings), settings)
    assert (config["timeoutSeconds"], config["compileTimeoutSeconds"]) == (10, 45)


@pytest.mark.parametrize("value", [0, 301])
def test_the_builds_time_limit_is_bounded(settings: OperatorSettings, value: int) -> None:
    assert settings.compile_timeout_seconds == 30
    with pytest.raises(ValueError, match="compile_timeout_seconds"):
        OperatorSettings(compile_timeout_seconds=value)


@pytest.mark.parametrize(
    ("language", "mode", "seconds"),
    [("go", "run", 7 + 30), ("csharp", "run", 7 + 30), ("python", "run", 7), ("python", "lint", 7)],
)
def test_a_runs_time_adds_the_builds_limit_when_it_builds(
    settings: OperatorSettings, language: str, mode: str, seconds: int
) -> None:
    """One rule (sandpod_contract.catalog.run_seconds) for the pod's deadline, the egress
    grant, the operator's checks and its calls to a serving runner."""
    spec = CodeExecutionSpec(language=language, source="x", mode=mode, timeout_seconds=7)
    plan = plan_execution(spec, CATALOG, settings)
    assert plan.run_seconds == seconds
    assert run_seconds(CATALOG.languages[language], mode, 7, 30) == seconds
    pod = build_pod(namespace="ns", execution_name="cx", uid="u-1", plan=plan, settings=settings)
    margin = settings.active_deadline_seconds_margin
    assert pod["spec"]["activeDeadlineSeconds"] == seconds + margin


# --- the runner's compile result ------------------------------------------------------------


def test_a_result_without_a_compile_step_reads_as_before() -> None:
    assert RunnerResult.model_validate(runner_wire.result()).compile is None


def test_the_termination_message_may_drop_the_compilers_output() -> None:
    full = RunnerResult.model_validate(failed_build("x" * 10_000))
    dropped = RunnerResult.model_validate(failed_build(""))
    forged = RunnerResult.model_validate(failed_build("something else"))
    other_exit = RunnerResult.model_validate(failed_build("", exitCode=2))
    assert full.agrees_with(dropped)
    assert not full.agrees_with(forged)
    assert not full.agrees_with(other_exit)
    assert not full.agrees_with(RunnerResult.model_validate(runner_wire.result(exitCode=None)))


# --- the operator's verdict and status ------------------------------------------------------


def test_a_failed_build_is_a_compilation_error(settings: OperatorSettings) -> None:
    verdict = observe(failed_build(), settings)
    assert (verdict.phase, verdict.reason) == ("Failed", "CompilationError")
    assert verdict.message == "the program did not build (compiler exit 1)"
    assert verdict.exit_code is None and verdict.retryable is False
    assert verdict.compile_output == GO_ERROR and verdict.compile_output_truncated is False
    assert verdict.stdout == "" and verdict.stderr == ""

    status = next_status(None, verdict, generation=1, pod_name="cx-pod", now=NOW)
    assert status["reason"] == "CompilationError"
    assert status["compileOutput"] == GO_ERROR
    assert "exitCode" not in status


def test_the_message_is_the_platforms_not_the_compilers(settings: OperatorSettings) -> None:
    verdict = observe(failed_build("Completed: all good\n", exitCode=None, signal=9), settings)
    assert verdict.message == "the program did not build (compiler killed by SIGKILL)"


def test_a_build_over_the_timeout_is_timed_out(settings: OperatorSettings) -> None:
    runner = failed_build("", exitCode=None, signal=9, timedOut=True)
    runner["timedOut"] = True
    verdict = observe(runner, settings)
    assert (verdict.phase, verdict.reason) == ("TimedOut", "DeadlineExceeded")
    assert "did not build within its compile time limit" in verdict.message


def test_a_program_that_built_keeps_its_own_output_and_the_compilers(
    settings: OperatorSettings,
) -> None:
    runner = runner_wire.result(stdoutBytes=6, compile=compiled(output="warning: unused\n"))
    verdict = observe(runner, settings, (("stdout", "hello\n"),))
    assert (verdict.phase, verdict.reason, verdict.exit_code) == ("Succeeded", "Completed", 0)
    assert verdict.stdout == "hello\n"
    assert verdict.compile_output == "warning: unused\n"


def test_compiler_output_in_status_is_bounded_as_stored(settings: OperatorSettings) -> None:
    small = settings.model_copy(update={"status_output_bytes": 100})
    verdict = observe(failed_build("\x01" * 1000), small)
    assert verdict.compile_output is not None
    assert len(json.dumps(verdict.compile_output)) - 2 <= 100
    assert verdict.compile_output_truncated is True


# --- the gateway ------------------------------------------------------------------------------


def test_the_gateway_says_compile_error_with_the_compilers_output() -> None:
    resource = {
        "metadata": {"name": "cx-1"},
        "spec": {"language": "go", "timeoutSeconds": 10},
        "status": {
            "phase": "Failed",
            "reason": "CompilationError",
            "message": "the program did not build (compiler exit 1)",
            "compileOutput": GO_ERROR,
            "compileOutputTruncated": False,
            "stdout": "",
        },
    }
    result = execution_result(resource)
    assert result.status == ExecutionStatus.compile_error
    assert result.compile_output == GO_ERROR
    assert result.error_message == "the program did not build (compiler exit 1)"
    assert result.exit_code is None


def test_a_plain_failure_stays_error() -> None:
    resource = {
        "metadata": {"name": "cx-1"},
        "spec": {"language": "go"},
        "status": {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 2},
    }
    result = execution_result(resource)
    assert result.status == ExecutionStatus.error
    assert result.compile_output is None


def test_get_languages_says_which_are_compiled() -> None:
    languages = {info.name: info for info in load_language_catalog(DEFAULT_CATALOG_PATH).all()}
    assert set(languages) == set(CATALOG.languages)
    assert {name for name, info in languages.items() if info.compiled} == set(COMPILED)


# --- the README's table -----------------------------------------------------------------------


def readme_languages() -> dict[str, list[str]]:
    """The rows of README.md's language table (between its markers): language -> cells."""
    text = (REPO_ROOT / "README.md").read_text()
    table = text.split("<!-- languages:begin -->")[1].split("<!-- languages:end -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return {row[0].strip("`"): row for row in cells}


def test_the_readme_table_lists_the_catalogs_languages() -> None:
    rows = readme_languages()
    assert set(rows) == set(CATALOG.languages)
    for name, row in rows.items():
        assert row[1] == CATALOG.languages[name].version, name


def test_the_docs_name_every_language() -> None:
    docs = (REPO_ROOT / "docs" / "gateway.md").read_text()
    for name in CATALOG.languages:
        assert re.search(rf"`{name}`", docs), name


def test_the_benchmark_covers_every_language_and_writes_the_table() -> None:
    from languages import HELLO, Row, markdown_table, with_table

    assert set(HELLO) == set(CATALOG.languages)
    row = Row("go", "1.19", "localhost/sandpod/go:0.1.0", "526.5 MiB", 3.14, 1234.0)
    table = markdown_table([row], runs=10)
    assert "| `go` | 1.19 | `localhost/sandpod/go:0.1.0` | 526.5 MiB | 3.1 s | 1234 ms |" in table
    readme = "intro\n<!-- languages:begin -->\nold\n<!-- languages:end -->\nrest\n"
    assert with_table(readme, table) == (
        f"intro\n<!-- languages:begin -->\n{table}\n<!-- languages:end -->\nrest\n"
    )
