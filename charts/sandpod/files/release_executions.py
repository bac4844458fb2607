"""`helm uninstall` (pre-delete hook): stop the operator, then release every CodeExecution and
SandboxPool it served from its finalizer, so that deleting the tenant namespaces (or the
CRDs) does not wait forever for an operator that is gone. The objects themselves are left
alone: those in the release's namespaces go with them, others stay as records (an operator
installed later takes them up again).

Standard library only (it runs in the operator image with `python3 -c`). Environment:
RELEASE_NAMESPACE, OPERATOR_DEPLOYMENT, OPERATOR_SELECTOR (label selector of its pods),
NAMESPACES (comma-separated names or "*" patterns; empty: every namespace), FINALIZER,
TIMEOUT_SECONDS.
"""

import fnmatch
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
EXECUTIONS = "/apis/sandpod.dev/v1alpha1"
MERGE_PATCH = "application/merge-patch+json"
PATCH_ATTEMPTS = 5
# What carries the operator's finalizer.
PLURALS = ("codeexecutions", "sandboxpools", "codesessions")


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Api:
    """The in-cluster API server, as this pod's service account."""

    def __init__(self) -> None:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        if ":" in host:
            host = f"[{host}]"
        self.base = f"https://{host}:{os.environ['KUBERNETES_SERVICE_PORT']}"
        with open(f"{SERVICE_ACCOUNT}/token") as token:
            self.token = token.read().strip()
        self.tls = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", MERGE_PATCH)
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.tls) as response:
                parsed: dict[str, Any] = json.loads(response.read() or b"{}")
                return parsed
        except urllib.error.HTTPError as error:
            raise ApiError(error.code, error.read().decode(errors="replace")[:500]) from error

    def list_all(self, path: str, **query: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self.request(
                "GET",
                f"{path}?{urllib.parse.urlencode({**query, 'limit': '500', 'continue': token})}",
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items


def stop_operator(
    api: Api, namespace: str, deployment: str, selector: str, deadline: float
) -> None:
    try:
        api.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale",
            {"spec": {"replicas": 0}},
        )
    except ApiError as error:
        if error.status != 404:
            raise
    while pods := api.list_all(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector):
        if time.monotonic() > deadline:
            names = ", ".join(pod["metadata"]["name"] for pod in pods)
            raise TimeoutError(f"the operator's pods are still there: {names}")
        time.sleep(1)
    print(f"the operator ({namespace}/{deployment}) is stopped")


def release(api: Api, plural: str, item: dict[str, Any], finalizer: str) -> bool:
    """Remove our finalizer (with the resourceVersion as precondition); False if not there."""
    metadata = item["metadata"]
    path = f"{EXECUTIONS}/namespaces/{metadata['namespace']}/{plural}/{metadata['name']}"
    for _ in range(PATCH_ATTEMPTS):
        finalizers = metadata.get("finalizers") or []
        if finalizer not in finalizers:
            return False
        patch = {
            "metadata": {
                "finalizers": [f for f in finalizers if f != finalizer],
                "resourceVersion": metadata["resourceVersion"],
            }
        }
        try:
            api.request("PATCH", path, patch)
            return True
        except ApiError as error:
            if error.status == 404:
                return False
            if error.status != 409:
                raise
        try:
            metadata = api.request("GET", path)["metadata"]
        except ApiError as error:
            if error.status == 404:
                return False
            raise
    raise RuntimeError(f"{path} kept changing; its finalizer is still there")


def items_in(api: Api, plural: str, namespace: str | None) -> list[dict[str, Any]]:
    path = (
        f"{EXECUTIONS}/namespaces/{namespace}/{plural}" if namespace else f"{EXECUTIONS}/{plural}"
    )
    try:
        return api.list_all(path)
    except ApiError as error:
        if error.status == 404:  # no such namespace, or the CRD is gone already
            return []
        raise


def scopes(namespaces: list[str]) -> list[str | None]:
    """Where to list: each named namespace, or everywhere (None) when there are none or
    some are patterns (then `served` filters what is listed)."""
    if not namespaces or any("*" in n for n in namespaces):
        return [None]
    return list(namespaces)


def served(namespaces: list[str], namespace: str) -> bool:
    return not namespaces or any(fnmatch.fnmatchcase(namespace, n) for n in namespaces)


def main() -> None:
    api = Api()
    deadline = time.monotonic() + int(os.environ["TIMEOUT_SECONDS"])
    stop_operator(
        api,
        os.environ["RELEASE_NAMESPACE"],
        os.environ["OPERATOR_DEPLOYMENT"],
        os.environ["OPERATOR_SELECTOR"],
        deadline,
    )
    namespaces = [n for n in os.environ.get("NAMESPACES", "").split(",") if n]
    finalizer = os.environ["FINALIZER"]
    released = 0
    for scope in scopes(namespaces):
        for plural in PLURALS:
            for item in items_in(api, plural, scope):
                if served(namespaces, item["metadata"]["namespace"]):
                    released += release(api, plural, item, finalizer)
    print(f"released {released} execution(s) and pool(s) from {finalizer}")


if __name__ == "__main__":
    try:
        main()
    except (ApiError, OSError, RuntimeError) as error:
        print(f"FAIL: {error}", file=sys.stderr)
        sys.exit(1)
