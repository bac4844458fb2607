"""Fixtures shared by unit and end-to-end tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from sandpod_testkit.paths import CACHE_DIR

# Cluster fixtures (tests/e2e/cluster_fixtures.py, on pythonpath): registered once for the
# session, so tests/e2e and tests/hostile share one CRD install and one operator.
pytest_plugins = ["cluster_fixtures"]


@pytest.fixture(scope="session")
def helm() -> Path:
    """The Helm binary: $HELM, else the one `make cluster-build` built, else `helm` on PATH.
    Missing Helm is a failure, never a skip."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    built = sorted(CACHE_DIR.glob("bin/helm-*/helm"), key=lambda path: path.stat().st_mtime)
    if built:
        return built[-1]
    on_path = shutil.which("helm")
    if on_path:
        return Path(on_path)
    pytest.fail(
        f"no helm: set HELM, run `make cluster-build` (builds {CACHE_DIR}/bin/helm-*) "
        "or put helm on PATH"
    )
