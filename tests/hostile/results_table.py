"""The results table of the hostile suite: one row per test (case, what is expected, what was
observed, PASS/FAIL), printed with totals at the end of the session. For a corpus case the
expectation is its proof of containment (corpus.Case.proof), and the observation is the
outcome with what the program reported, side by side. conftest.py registers the hooks."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Row:
    suite: str
    case: str
    expected: str = ""  # the proof of containment, for a corpus case
    observed: str = "(not observed)"
    outcome: str = ""


ROWS = pytest.StashKey[list[Row]]()
ITEM_ROW = pytest.StashKey[Row]()


@pytest.fixture
def table_row(request: pytest.FixtureRequest) -> Row:
    """This test's row in the results table: set `expected` and `observed` before asserting."""
    item = request.node
    suite = Path(str(item.fspath)).stem.removeprefix("test_")
    callspec = getattr(item, "callspec", None)
    case = callspec.id if callspec is not None else item.name.removeprefix("test_")
    row = Row(suite=suite, case=case)
    item.stash[ITEM_ROW] = row
    item.config.stash.setdefault(ROWS, []).append(row)
    return row


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    row = item.stash.get(ITEM_ROW, None)
    if row is not None and (report.when == "call" or report.failed):
        if report.passed:
            row.outcome = row.outcome or "PASS"
        elif report.failed:
            row.outcome = "FAIL"
        else:
            row.outcome = "SKIP"
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = config.stash.get(ROWS, [])
    if not rows:
        return
    headers = ("suite", "case", "expected (proof)", "observed", "result")
    cells = [(r.suite, r.case, r.expected, r.observed, r.outcome or "FAIL") for r in rows]
    caps = (20, 45, 80, 100, 6)
    widths = [
        min(max(len(h), *(len(c[i]) for c in cells)), cap)
        for i, (h, cap) in enumerate(zip(headers, caps, strict=True))
    ]

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(
            (v if len(v) <= w else v[: w - 1] + "…").ljust(w)
            for v, w in zip(values, widths, strict=True)
        )

    terminalreporter.section("hostile code and faults")
    terminalreporter.write_line(line(headers))
    terminalreporter.write_line(line(tuple("-" * w for w in widths)))  # type: ignore[arg-type]
    for values in cells:
        terminalreporter.write_line(line(values))
    passed = sum(1 for c in cells if c[4] == "PASS")
    failed = sum(1 for c in cells if c[4] == "FAIL")
    terminalreporter.write_line(
        f"total {len(cells)}: {passed} passed, {failed} failed, "
        f"{len(cells) - passed - failed} skipped"
    )
