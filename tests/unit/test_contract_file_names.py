"""The file name rule (sandpod_contract.file_names) against the table the runner's Go test
reads too (images/runner/internal/runner/testdata/file_names.json)."""

import json
from pathlib import Path
from typing import Any

import pytest
from sandpod_contract.file_names import name_problem

TABLE = Path(__file__).parents[2] / "images/runner/internal/runner/testdata/file_names.json"
CASES: list[dict[str, Any]] = json.loads(TABLE.read_text())["names"]


@pytest.mark.parametrize("case", CASES, ids=[ascii(case["name"]) for case in CASES])
def test_the_rule_refuses_what_the_shared_table_says(case: dict[str, Any]) -> None:
    problem = name_problem(case["name"])
    if not case["refused"]:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(f"{case['character']} (")


def test_the_table_has_both_kinds_and_the_characters_the_issue_names() -> None:
    refused = {case["character"].split()[0] for case in CASES if case["refused"]}
    bidi = {"U+061C", "U+200E", "U+200F", *(f"U+{c:04X}" for c in range(0x202A, 0x202F))}
    bidi |= {f"U+{c:04X}" for c in range(0x2066, 0x206A)}
    zero_width = {"U+200B", "U+200C", "U+200D", "U+2060", "U+FEFF"}
    assert bidi | zero_width | {"U+0000", "U+000A", "U+007F"} <= refused
    assert any(not case["refused"] for case in CASES)


def test_a_refusal_names_the_character_and_what_it_is() -> None:
    assert name_problem("report\u202etxt.exe") == (
        "U+202E RIGHT-TO-LEFT OVERRIDE (a bidirectional control character)"
    )
    assert name_problem("a\u200bb") == "U+200B ZERO WIDTH SPACE (an invisible format character)"
    assert name_problem("a\nb") == "U+000A (a control character)"
    assert name_problem("x\u2028\u202e") == "U+2028 LINE SEPARATOR (a line separator)"


def test_a_lone_surrogate_is_refused() -> None:
    # Not in the shared table: Go's JSON decoder turns it into U+FFFD (and a Go string
    # cannot hold one as valid UTF-8, which the runner requires of a name anyway).
    assert name_problem("a\ud800.txt") == "U+D800 (a lone surrogate)"
