"""The uninstall hook's choice of what to release (charts/sandpod/files/release_executions.py)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from sandpod_testkit.paths import REPO_ROOT


def hook() -> ModuleType:
    path = REPO_ROOT / "charts" / "sandpod" / "files" / "release_executions.py"
    spec = importlib.util.spec_from_file_location("release_executions", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_named_namespaces_are_listed_one_by_one() -> None:
    assert hook().scopes(["team-a", "team-b"]) == ["team-a", "team-b"]


def test_patterns_or_no_names_list_everywhere() -> None:
    assert hook().scopes([]) == [None]
    assert hook().scopes(["team-a", "e2e-*"]) == [None]


def test_served_follows_names_and_patterns() -> None:
    served = hook().served
    assert served([], "anything")
    assert served(["team-a", "e2e-*"], "team-a")
    assert served(["team-a", "e2e-*"], "e2e-x-1")
    assert not served(["team-a", "e2e-*"], "team-b")
    assert not served(["e2e-*"], "sandpod-system")
