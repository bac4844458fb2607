"""JavaScript and TypeScript sessions keep their state in a node kernel (images/node/kernel.mjs,
docs/runner-protocol.md "Node: the kernel on fd 3"), through the gateway against the cluster:
variables, functions and imports across runs, `let`/`const` declared again, top-level
`await`, the trailing expression as `result`, types stripped, and the state lost (a fresh
kernel) after a timeout or a crash. Needs the node image built from this tree."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from sandpod_testkit.sessions import open_session, run_in

# alice: a tenant serving the test's namespace, with two sessions and 60 s runs.
from test_sessions_through_gateway import alice

__all__ = ["alice"]


@pytest.fixture
def session_in(alice: httpx.Client) -> Iterator[Callable[[str], str]]:
    """Opens a session of alice's in a language; every one is closed afterwards."""
    opened: list[str] = []

    def open_in(language: str) -> str:
        opened.append(open_session(alice, language))
        return opened[-1]

    yield open_in
    for session in opened:
        alice.delete(f"/v1/sessions/{session}")


def outcome(answer: dict[str, object]) -> tuple[object, ...]:
    return tuple(answer[key] for key in ("status", "stdout", "stderr", "result", "state_lost"))


def test_javascript_keeps_variables_functions_and_imports_across_three_runs(
    alice: httpx.Client, session_in: Callable[[str], str]
) -> None:
    session = session_in("javascript")

    first = run_in(
        alice,
        session,
        "import { join } from 'node:path'\nlet x = 40\nfunction inc(n) { return n + 1 }",
    )
    second = run_in(alice, session, "x = inc(x)\nconsole.log(join('a', 'b'))\nx")
    third = run_in(
        alice, session, "let x = 'again'\nconst y = await Promise.resolve(inc(41))\nx + ' ' + y"
    )

    assert outcome(first) == ("success", "", "", None, False), first
    assert outcome(second) == ("success", "a/b\n", "", "41", False), second
    assert outcome(third) == ("success", "", "", "'again 42'", False), third
    assert third["reported_by"] == "sessionKernel"


def test_typescript_has_its_types_stripped_and_keeps_its_state_across_file_transfers(
    alice: httpx.Client, session_in: Callable[[str], str]
) -> None:
    session = session_in("typescript")

    first = run_in(
        alice,
        session,
        "enum Level { High = 3 }\ninterface P { n: number }\nconst p: P = { n: Level.High }",
    )
    second = run_in(alice, session, "const twice = (v: number): number => v * 2\ntwice(p.n)")
    uploaded = alice.put(f"/v1/sessions/{session}/files/data.txt", content=b"moved")
    downloaded = alice.get(f"/v1/sessions/{session}/files/data.txt")
    # The file transfers, runs in the session too, leave its variables (p) as they were.
    third = run_in(alice, session, "twice(p.n)")

    assert outcome(first) == ("success", "", "", None, False), first
    assert outcome(second) == ("success", "", "", "6", False), second
    assert (uploaded.status_code, downloaded.status_code) == (200, 200), downloaded.text
    assert downloaded.content == b"moved"
    assert outcome(third) == ("success", "", "", "6", False), third


def test_a_timeout_then_a_crash_lose_the_javascript_state(
    alice: httpx.Client, session_in: Callable[[str], str]
) -> None:
    session = session_in("javascript")

    kept = run_in(alice, session, "let x = 1\nx")
    hung = run_in(alice, session, "console.log('spinning')\nwhile (true) {}", timeout_seconds=3)
    after_timeout = run_in(alice, session, "typeof x")
    defined = run_in(alice, session, "let x = 2\nx")
    crashed = run_in(alice, session, "process.exit(3)")
    after_crash = run_in(alice, session, "typeof x")

    assert outcome(kept) == ("success", "", "", "1", False), kept
    assert (hung["status"], hung["stdout"], hung["state_lost"]) == ("timeout", "spinning\n", True)
    assert outcome(after_timeout) == ("success", "", "", "'undefined'", True), after_timeout
    assert outcome(defined) == ("success", "", "", "2", False), defined
    assert (crashed["status"], crashed["exit_code"], crashed["state_lost"]) == ("error", 3, True)
    assert outcome(after_crash) == ("success", "", "", "'undefined'", True), after_crash
