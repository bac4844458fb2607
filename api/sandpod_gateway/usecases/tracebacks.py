"""The uncaught exception a Python program's stderr ends with, for error_message.

What is read here is the program's own output (the runner's verified stderr frames): a
program can print any traceback it likes. So it is only ever quoted, as what its stderr
reads, never stated as what the platform saw (docs/gateway.md, "Results").
"""

import re

PYTHON = "python"
# The interpreter's exit status after an uncaught exception.
UNCAUGHT_EXIT_CODE = 1
MAX_EXCEPTION_CHARS = 300

# A traceback entry (`  File "main.py", line 3, in <module>`), also the first line of a
# SyntaxError's report.
_ENTRY = re.compile(r'^  File ".*", line \d+')
# `NameError: name 'x' is not defined`, `json.decoder.JSONDecodeError: ...`, `KeyboardInterrupt`.
_EXCEPTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(: .*)?$")


def last_exception(stderr: str) -> str | None:
    """The exception line of the last traceback in `stderr`: the first line after its last
    entry that is not indented (source lines and carets are), if it reads as one."""
    lines = stderr.splitlines()
    entry = next((i for i in range(len(lines) - 1, -1, -1) if _ENTRY.match(lines[i])), None)
    if entry is None:
        return None
    line = next((line for line in lines[entry + 1 :] if not line[:1].isspace()), None)
    if line is None or not _EXCEPTION.match(line):
        return None
    if len(line) > MAX_EXCEPTION_CHARS:
        return line[: MAX_EXCEPTION_CHARS - 1] + "…"
    return line


def uncaught_exception_note(language: str, exit_code: int | None, stderr: str) -> str | None:
    """For a Python program that exited as after an uncaught exception: the words its
    stderr's last traceback ends with, quoted as the program's."""
    if language != PYTHON or exit_code != UNCAUGHT_EXIT_CODE:
        return None
    exception = last_exception(stderr)
    if exception is None:
        return None
    return f'the last traceback on its stderr reads "{exception}"'
