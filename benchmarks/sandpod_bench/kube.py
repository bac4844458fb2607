"""Small helpers over the Kubernetes client: a client with a larger connection pool, and a
watch that yields raw objects (dicts) for any list method."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config

Manifest = dict[str, Any]


def connect(kubeconfig: Path, pool: int) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def watch_events(
    list_method: Callable[..., Any],
    *args: Any,
    resource_version: str,
    timeout_seconds: int,
    **kwargs: Any,
) -> Iterator[tuple[str, Manifest]]:
    """One watch request as (type, raw object) pairs, ending when the server ends it. An
    ERROR event (e.g. 410 Gone: the version is too old) raises ApiException."""
    response = list_method(
        *args,
        **kwargs,
        watch=True,
        resource_version=resource_version,
        allow_watch_bookmarks=True,
        timeout_seconds=timeout_seconds,
        _preload_content=False,
    )
    try:
        pending = b""
        for chunk in response.stream(amt=None, decode_content=True):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise client.ApiException(
                        status=int(status.get("code") or 500), reason=str(status)
                    )
                yield event["type"], event["object"]
    finally:
        response.release_conn()


def list_raw(list_method: Callable[..., Any], *args: Any, **kwargs: Any) -> Manifest:
    """A list call's body as a dict (the CRD has no client model; pods stay comparable)."""
    response = list_method(*args, **kwargs, _preload_content=False)
    parsed: Manifest = json.loads(response.data)
    return parsed
