"""error_message of a Python program that ended with an uncaught exception: its name and
message, quoted from its stderr as the program's words."""

import pytest
from sandpod_gateway.kube.resources import execution_result
from sandpod_gateway.usecases.tracebacks import MAX_EXCEPTION_CHARS, last_exception

NAME_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "/tmp/work/main.py", line 1, in <module>\n'
    "    pritn('hi')\n"
    "    ^^^^^\n"
    "NameError: name 'pritn' is not defined. Did you mean: 'print'?\n"
)
SYNTAX_ERROR = (
    '  File "/tmp/work/main.py", line 1\n'
    "    print(\n"
    "         ^\n"
    "SyntaxError: '(' was never closed\n"
)
CHAINED = (
    "Traceback (most recent call last):\n"
    '  File "/tmp/work/main.py", line 2, in <module>\n'
    "    1 / 0\n"
    "ZeroDivisionError: division by zero\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "Traceback (most recent call last):\n"
    '  File "/tmp/work/main.py", line 4, in <module>\n'
    '    raise KeyError("k") from e\n'
    "KeyError: 'k'\n"
)
IN_A_SESSION = (
    "Traceback (most recent call last):\n"
    '  File "<cell 2>", line 1, in <module>\n'
    "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n"
)


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (NAME_ERROR, "NameError: name 'pritn' is not defined. Did you mean: 'print'?"),
        (SYNTAX_ERROR, "SyntaxError: '(' was never closed"),
        (CHAINED, "KeyError: 'k'"),
        (IN_A_SESSION, "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        (
            "logged\n" + NAME_ERROR + "more\n",
            "NameError: name 'pritn' is not defined. Did you mean: 'print'?",
        ),
        (
            'Traceback (most recent call last):\n  File "m.py", line 1\nKeyboardInterrupt\n',
            "KeyboardInterrupt",
        ),
        ('  File "m.py", line 3\nValueError: first line\nsecond line\n', "ValueError: first line"),
        ("", None),
        ("Error: something failed\n", None),
        ('  File "m.py", line 3\n    x\n', None),
        ('  File "m.py", line 3\n- not an exception line\n', None),
    ],
)
def test_the_last_tracebacks_exception_line(stderr: str, expected: str | None) -> None:
    assert last_exception(stderr) == expected


def test_a_long_exception_line_is_cut() -> None:
    found = last_exception('  File "m.py", line 1\nValueError: ' + "x" * 1000 + "\n")
    assert found is not None and len(found) == MAX_EXCEPTION_CHARS and found.endswith("…")


def failed(language: str = "python", exit_code: int = 1, stderr: str = NAME_ERROR) -> dict:
    return {
        "metadata": {"name": "cx-1"},
        "spec": {"language": language, "mode": "run", "timeoutSeconds": 10},
        "status": {
            "phase": "Failed",
            "reason": "NonZeroExit",
            "message": f"the program exited with code {exit_code}",
            "exitCode": exit_code,
            "stderr": stderr,
            "reportedBy": "runner",
        },
    }


def test_error_message_names_the_uncaught_exception_as_the_programs_words() -> None:
    result = execution_result(failed())
    assert result.error_message == (
        "the program exited with code 1; the last traceback on its stderr reads "
        "\"NameError: name 'pritn' is not defined. Did you mean: 'print'?\""
    )


@pytest.mark.parametrize(
    "resource",
    [
        failed(language="bash"),
        failed(language="javascript"),
        failed(exit_code=2),
        failed(stderr="boom\n"),
    ],
)
def test_other_languages_and_exits_keep_the_platforms_words(resource: dict) -> None:
    code = resource["status"]["exitCode"]
    assert execution_result(resource).error_message == f"the program exited with code {code}"
