"""Shell commands in a session's sandbox, beside its interpreter (sandpod's
POST /v1/sessions/{id}/commands, E2B's commands.run): a run in the session, with its files,
limits and the runner's seccomp filter. A Python session's interpreter starts the command
(`subprocess`, its output the run's own stdout and stderr, so it streams as it comes); in a
bash session the command is the run. The run's value is the command's exit status."""

import re
import shlex

from sandpod_contract.runner import OutputListener

from sandpod_gateway.kube.resources import Resource
from sandpod_gateway.schemas import ExecutionResult, ExecutionStatus, SessionExecutionRequest
from sandpod_gateway.usecases.sessions import SessionContext, live_session, run_in_session
from sandpod_gateway.web.errors import GatewayError

WORK_DIR = "/tmp/work"
SHELL = ["/bin/bash", "-lc"]
# Languages whose sessions take commands, and how.
PYTHON, BASH = "python", "bash"
_EXIT_STATUS = re.compile(r"^-?[0-9]{1,10}$")

_PYTHON_COMMAND = r"""
import os, subprocess, sys
sys.stdout.flush()
sys.stderr.flush()
status = subprocess.run(ARGV, cwd=CWD, env={**os.environ, **ENV},
                        stdin=subprocess.DEVNULL).returncode
"""


def work_path(relative: str | None) -> str:
    return WORK_DIR if not relative else f"{WORK_DIR}/{relative}"


def python_command(argv: list[str], cwd: str, env: dict[str, str]) -> str:
    """A Python session's run that starts `argv` in `cwd` with `env` added; its value is the
    exit status (negative: the signal that ended it). It binds no name in the session."""
    namespace = {"ARGV": argv, "CWD": cwd, "ENV": env}
    return f"(lambda g: (exec({_PYTHON_COMMAND!r}, g), g['status'])[1])({namespace!r})"


def bash_command(command: str, cwd: str, env: dict[str, str]) -> str:
    """A bash session's run of `command` in `cwd` with `env` exported."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    return f"cd {shlex.quote(cwd)} || exit 1\n{exports}{command}\n"


def exit_status(language: str, result: ExecutionResult) -> int | None:
    """The command's exit status, from the run that started it; None when the run did not
    end by itself (a timeout, a cancel, the sandbox lost)."""
    if result.status not in (ExecutionStatus.success, ExecutionStatus.error):
        return None
    if language == BASH:
        return result.exit_code
    value = result.result or ""
    return int(value) if result.exit_code == 0 and _EXIT_STATUS.match(value) else None


def command_result(language: str, result: ExecutionResult) -> ExecutionResult:
    """The run's result as the command's: its exit status as exit_code (success when 0)."""
    status = exit_status(language, result)
    if status is None:
        return result
    outcome = ExecutionStatus.success if status == 0 else ExecutionStatus.error
    return result.model_copy(update={"exit_code": status, "status": outcome, "result": None})


async def session_language(session_id: str, ctx: SessionContext) -> str:
    tenant = ctx.tenant.name
    session = ctx.known.get(tenant, session_id)
    if session is None:
        session = await live_session(session_id, ctx)
        ctx.known.remember(tenant, session_id, session)
    return str((session.get("spec") or {}).get("language", ""))


async def run_command(
    session_id: str,
    argv: list[str],
    *,
    cwd: str | None,
    env: dict[str, str],
    ctx: SessionContext,
    timeout_seconds: int | None = None,
    idempotency_key: str | None = None,
    on_output: OutputListener | None = None,
    name: str | None = None,
    session: Resource | None = None,
) -> tuple[str, ExecutionResult]:
    """Run `argv` in the session (`cwd` relative to its work directory, or absolute): the
    session's language and the run's result (see command_result). `session`: as run_in_session's."""
    language = await session_language(session_id, ctx)
    where = cwd if cwd is not None and cwd.startswith("/") else work_path(cwd)
    if language == PYTHON:
        code = python_command(argv, where, env)
    elif language == BASH and argv[:2] == SHELL and len(argv) == 3:
        code = bash_command(argv[2], where, env)
    else:
        raise GatewayError(
            422,
            "commands_unsupported",
            f"Commands run in python and bash sessions; this session runs {language}.",
        )
    body = SessionExecutionRequest(code=code, timeout_seconds=timeout_seconds)
    outcome = await run_in_session(
        session_id,
        body,
        ctx,
        idempotency_key=idempotency_key,
        wait=True,
        on_output=on_output,
        name=name,
        session=session,
    )
    return language, outcome.result
