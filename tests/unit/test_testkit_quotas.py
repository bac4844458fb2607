"""What counts as a ResourceQuota counted, or stuck, for the wait that `make run` and the
cluster suites do after an install (sandpod_testkit.quotas)."""

from typing import Any

import pytest
from sandpod_testkit.quotas import recreated, stuck, uncounted

EXECUTIONS = "count/codeexecutions.sandpod.dev"
SESSIONS = "count/codesessions.sandpod.dev"
HARD = {EXECUTIONS: "5000", SESSIONS: "100"}


def quota(status: dict[str, Any] | None) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "metadata": {
            "name": "sandpod-objects",
            "namespace": "team",
            "uid": "u-1",
            "resourceVersion": "7",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "sandpod"},
        },
        "spec": {"hard": HARD},
    }
    if status is not None:
        manifest["status"] = status
    return manifest


@pytest.mark.parametrize(
    ("status", "left", "is_stuck"),
    [
        (None, [EXECUTIONS, SESSIONS], False),  # not synced yet
        ({}, [EXECUTIONS, SESSIONS], False),
        # Synced before the controller found the CRDs: the API server refuses creates.
        ({"hard": HARD}, [EXECUTIONS, SESSIONS], True),
        ({"hard": HARD, "used": {SESSIONS: "0"}}, [EXECUTIONS], True),
        ({"hard": {EXECUTIONS: "5000"}, "used": {EXECUTIONS: "0"}}, [SESSIONS], False),
        ({"hard": HARD, "used": {EXECUTIONS: "3", SESSIONS: "0"}}, [], False),
    ],
)
def test_a_quota_is_counted_once_its_status_has_the_usage_of_each_limit(
    status: dict[str, Any] | None, left: list[str], is_stuck: bool
) -> None:
    assert uncounted(quota(status)) == left
    assert stuck(quota(status)) is is_stuck


def test_a_stuck_quota_is_made_again_as_it_was_and_as_new() -> None:
    manifest = recreated(quota({"hard": HARD}))

    assert manifest == {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": "sandpod-objects",
            "namespace": "team",
            "labels": {"app.kubernetes.io/managed-by": "Helm"},
            "annotations": {"meta.helm.sh/release-name": "sandpod"},
        },
        "spec": {"hard": HARD},
    }
