"""Shell commands in a session (sandpod_gateway/usecases/session_commands.py): the programs
that start them, run for real by a fresh interpreter and by bash, and how a run's result
becomes the command's."""

import subprocess
import sys
from pathlib import Path

import pytest
from sandpod_gateway.schemas import ExecutionResult, ExecutionStatus
from sandpod_gateway.usecases.session_commands import (
    BASH,
    PYTHON,
    SHELL,
    bash_command,
    command_result,
    python_command,
)


def test_a_python_sessions_program_runs_the_command_and_answers_its_exit_status(
    tmp_path: Path,
) -> None:
    program = python_command(
        [*SHELL, "echo $GREETING from $(basename $PWD); echo oops >&2; exit 3"],
        str(tmp_path),
        {"GREETING": "hi 'there'"},
    )
    ran = subprocess.run(
        [sys.executable, "-c", f"print(repr({program}))"], capture_output=True, text=True
    )

    assert ran.stdout == f"hi 'there' from {tmp_path.name}\n3\n"
    assert ran.stderr == "oops\n"


def test_a_bash_sessions_run_is_the_command_with_its_directory_and_environment(
    tmp_path: Path,
) -> None:
    script = bash_command(
        'echo "$WHO" in $(basename $PWD); exit 4', str(tmp_path), {"WHO": "a b;c"}
    )
    ran = subprocess.run(["bash", "-c", script], capture_output=True, text=True)

    assert (ran.stdout, ran.returncode) == (f"a b;c in {tmp_path.name}\n", 4)


def result(status: ExecutionStatus, exit_code: int | None, value: str | None) -> ExecutionResult:
    return ExecutionResult(
        id="cx-1", status=status, language=PYTHON, exit_code=exit_code, result=value
    )


@pytest.mark.parametrize(
    ("language", "run", "expected"),
    [
        (PYTHON, result(ExecutionStatus.success, 0, "0"), (ExecutionStatus.success, 0)),
        (PYTHON, result(ExecutionStatus.success, 0, "-9"), (ExecutionStatus.error, -9)),
        (BASH, result(ExecutionStatus.error, 4, None), (ExecutionStatus.error, 4)),
        # The interpreter failed before the command ended: the run's own result stands.
        (PYTHON, result(ExecutionStatus.error, 1, None), (ExecutionStatus.error, 1)),
        (PYTHON, result(ExecutionStatus.timeout, None, None), (ExecutionStatus.timeout, None)),
    ],
    ids=["python-0", "python-signal", "bash-4", "python-failed", "timeout"],
)
def test_the_runs_result_becomes_the_commands(
    language: str, run: ExecutionResult, expected: tuple[ExecutionStatus, int | None]
) -> None:
    answered = command_result(language, run)

    assert (answered.status, answered.exit_code) == expected
