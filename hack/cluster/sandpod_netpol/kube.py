"""A local copy of pods, namespaces and NetworkPolicies, kept current by list + watch.

Objects stay the raw JSON dicts the API server sends (the rules are built from
those), so the generated client is called with _preload_content=False.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aiohttp

from sandpod_netpol.selection import Object, PodKey, object_key

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
LIST_TIMEOUT_SECONDS = 60
TOMBSTONE_SECONDS = 120.0

EventHandler = Callable[[str, Object | None], None]  # (ADDED|MODIFIED|DELETED|RELISTED, object)
ListCall = Callable[..., Awaitable[Any]]


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"API server answered {status}: {message}")
        self.status = status


class ResourceExpired(ApiError):
    """410 Gone: the watch's resourceVersion is too old, relist."""


def _resource_version(obj: Object) -> int | None:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


def _older(candidate: int | None, known: int | None) -> bool:
    return candidate is not None and known is not None and candidate < known


class ObjectStore:
    """The newest version seen of every object of one kind.

    Objects arrive both from the watch and from point reads made while a pod is
    being set up; a version older than one already seen (or than its deletion)
    is ignored, so a slow read can neither roll an object back nor resurrect it.
    """

    def __init__(self) -> None:
        self._objects: dict[PodKey, Object] = {}
        self._deleted: dict[PodKey, tuple[int | None, float]] = {}

    def values(self) -> list[Object]:
        return list(self._objects.values())

    def get(self, key: PodKey) -> Object | None:
        return self._objects.get(key)

    def keys(self) -> set[PodKey]:
        return set(self._objects)

    def replace(self, objects: Iterable[Object]) -> None:
        self._objects = {object_key(obj): obj for obj in objects}

    def upsert(self, obj: Object) -> bool:
        key = object_key(obj)
        version = _resource_version(obj)
        current = self._objects.get(key)
        if current is not None and _older(version, _resource_version(current)):
            return False
        if current is None and key in self._deleted and _older(version, self._deleted[key][0]):
            return False
        self._objects[key] = obj
        self._deleted.pop(key, None)
        return True

    def delete(self, obj: Object) -> bool:
        key = object_key(obj)
        now = time.monotonic()
        self._deleted = {
            known: entry
            for known, entry in self._deleted.items()
            if now - entry[1] < TOMBSTONE_SECONDS
        }
        self._deleted[key] = (_resource_version(obj), now)
        return self._objects.pop(key, None) is not None


async def _checked(response: aiohttp.ClientResponse) -> aiohttp.ClientResponse:
    if response.status != 200:
        body = await response.text()
        response.release()
        try:
            message = str(json.loads(body)["message"])  # a metav1.Status
        except (ValueError, KeyError, TypeError):
            message = body.strip()
        error = ResourceExpired if response.status == 410 else ApiError
        raise error(response.status, message)
    return response


async def read_json(call: ListCall, *args: Any, **params: Any) -> Any:
    """One request through a generated client method; the decoded JSON body."""
    response = await _checked(
        await call(*args, _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS, **params)
    )
    try:
        return await response.json()
    finally:
        response.release()


async def _json_lines(response: aiohttp.ClientResponse) -> AsyncIterator[Any]:
    # Split lines ourselves: aiohttp's readline refuses lines over 128 KiB (big pods).
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        buffer.extend(chunk)
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield json.loads(line)


class Reflector:
    """Keeps one ObjectStore equal to the API server's collection (all namespaces)."""

    def __init__(
        self, kind: str, list_call: ListCall, store: ObjectStore, on_event: EventHandler
    ) -> None:
        self.kind = kind
        self._list_call = list_call
        self._store = store
        self._on_event = on_event

    async def relist(self) -> str:
        """Replace the store with a fresh list; returns the list's resourceVersion."""
        body = await read_json(self._list_call)
        self._store.replace(body.get("items") or [])
        self._on_event("RELISTED", None)
        log.debug("listed %d %s", len(body.get("items") or []), self.kind)
        return str(body["metadata"]["resourceVersion"])

    async def run(self, resource_version: str) -> None:
        """Watch from resource_version forever, relisting when the watch expires."""
        version: str | None = resource_version
        delay = 0.5
        while True:
            try:
                if version is None:
                    version = await self.relist()
                version = await self._watch(version)
                delay = 0.5
            except ResourceExpired:
                log.info("%s watch expired, relisting", self.kind)
                version = None
            except (aiohttp.ClientError, TimeoutError, ApiError, ValueError) as error:
                log.warning("%s watch failed (%s), retrying in %.1fs", self.kind, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _watch(self, resource_version: str) -> str:
        response = await _checked(
            await self._list_call(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=30, sock_read=WATCH_SECONDS + 30
                ),
            )
        )
        try:
            async for event in _json_lines(response):
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    error = ResourceExpired if code == 410 else ApiError
                    raise error(code, str(obj.get("message")))
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if kind in ("ADDED", "MODIFIED"):
                    if self._store.upsert(obj):
                        self._on_event(kind, obj)
                elif kind == "DELETED":
                    self._store.delete(obj)
                    self._on_event(kind, obj)
        finally:
            response.release()
        return resource_version
