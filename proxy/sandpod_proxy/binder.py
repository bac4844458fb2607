"""The egress proxy's binder: which sandbox pod holds a client address, for the grant helper.

    sandpod-proxy-binder --port 9182 [--host 0.0.0.0] [--kubeconfig PATH]

A grant is signed before its pod exists, so the proxy learns the pod from the cluster: the
binder lists and watches sandbox pods (label sandpod.dev/role=sandbox, every namespace) and
keeps, per pod address, the owner the operator made the pod for (its controller: a
CodeExecution or a CodeSession, by uid) while the pod lives (an address, not yet finished,
not being deleted, not the node's). The grant helper asks it over loopback, so no request
waits on the API server:

    GET /owners/<address>?wait=<seconds>  200 {"namespace", "uid"}, else 404 after waiting
                                          up to `wait` (a pod's first request may come
                                          before its address reached the API server);
                                          403 to any client but loopback (the pod's own)
    GET /healthz                          200 once in step with the cluster, else 503 (the
                                          kubelet's readiness probe)

No single live pod at an address (none, two: the binder refuses to guess) or a binder out
of step with the cluster (starting, or re-listing after a broken watch) is a 404: the helper
then refuses the request.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from sandpod_contract.kube import open_api_client
from sandpod_contract.names import GROUP, KIND, ROLE_LABEL, SANDBOX_ROLE, SESSION_KIND

logger = logging.getLogger(__name__)

SELECTOR = f"{ROLE_LABEL}={SANDBOX_ROLE}"
OWNER_KINDS = frozenset({KIND, SESSION_KIND})
MAX_WAIT_SECONDS = 10.0
WATCH_SECONDS = 300
LIST_TIMEOUT_SECONDS = 30
# A watch that has said nothing (no event, no bookmark) for this long is dead.
WATCH_READ_TIMEOUT = (10, WATCH_SECONDS + 30)
RETRY_SECONDS = 1.0
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Owner:
    """What a sandbox pod was made for: an execution or a session, by uid."""

    namespace: str
    uid: str


def normal_address(text: str) -> str | None:
    """An address as one string per host (IPv4-mapped IPv6 as IPv4), None if not one."""
    try:
        address = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def pod_binding(pod: Mapping[str, Any]) -> tuple[Owner, frozenset[str]] | None:
    """The owner and addresses of a live sandbox pod, None when it binds nothing."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or spec.get("hostNetwork"):
        return None
    if status.get("phase") in FINISHED_PHASES:
        return None
    controllers = [
        ref
        for ref in meta.get("ownerReferences") or []
        if ref.get("controller")
        and str(ref.get("apiVersion", "")).split("/")[0] == GROUP
        and ref.get("kind") in OWNER_KINDS
        and ref.get("uid")
    ]
    namespace = meta.get("namespace")
    if len(controllers) != 1 or not namespace:
        return None
    listed = [entry.get("ip") for entry in status.get("podIPs") or []] + [status.get("podIP")]
    addresses = frozenset(a for a in (normal_address(str(ip)) for ip in listed if ip) if a)
    if not addresses:
        return None
    return Owner(str(namespace), str(controllers[0]["uid"])), addresses


@dataclass
class Bindings:
    """Live sandbox pods by uid, and who holds each address."""

    pods: dict[str, tuple[Owner, frozenset[str]]] = field(default_factory=dict)
    holders: dict[str, set[str]] = field(default_factory=dict)  # address -> pod uids

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self.pods.clear()
        self.holders.clear()
        for pod in pods:
            self.apply("ADDED", pod)

    def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        self._forget(uid)
        binding = None if event_type == "DELETED" else pod_binding(pod)
        if binding is None:
            return
        self.pods[uid] = binding
        for address in binding[1]:
            self.holders.setdefault(address, set()).add(uid)

    def owner(self, address: str) -> Owner | None:
        """The owner of the one live pod at `address`; None for none, or for several."""
        holders = self.holders.get(address) or set()
        if len(holders) != 1:
            return None
        return self.pods[next(iter(holders))][0]

    def _forget(self, uid: str) -> None:
        known = self.pods.pop(uid, None)
        if known is None:
            return
        for address in known[1]:
            holders = self.holders.get(address, set())
            holders.discard(uid)
            if not holders:
                self.holders.pop(address, None)


class Binder:
    """Bindings kept in step with the cluster by a list, then watches from its version."""

    def __init__(self, core: CoreV1Api) -> None:
        self._core = core
        self.bindings = Bindings()
        self.in_step = False
        self._changed = asyncio.Condition()

    async def owner(self, address: str, wait: float) -> Owner | None:
        """The owner at `address`, waiting up to `wait` seconds for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
        async with self._changed:
            while True:
                found = self.bindings.owner(address) if self.in_step else None
                left = deadline - loop.time()
                if found is not None or left <= 0:
                    return found
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    return None

    async def run(self) -> None:
        """Forever: list, then watch; after any failure, out of step until listed again."""
        while True:
            try:
                version: str | None = await self._list()
                while version is not None:
                    version = await self._watch(version)
            except (ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                logger.warning("sandbox pods: %s; listing again", error)
            await self._out_of_step()
            await asyncio.sleep(RETRY_SECONDS)

    async def _list(self) -> str:
        # Not preloaded: the raw aiohttp response (the client's annotation says V1PodList).
        response: Any = await self._core.list_pod_for_all_namespaces(
            label_selector=SELECTOR, _preload_content=False, _request_timeout=LIST_TIMEOUT_SECONDS
        )
        try:
            body = await response.read()
        finally:
            response.release()
        if response.status >= 400:
            raise ApiException(status=response.status, reason=body[:200].decode(errors="replace"))
        listed = json.loads(body)
        await self.replace(listed.get("items") or [])
        return str(listed["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> str | None:
        """One watch from `version`: the version to go on from, None when it is too old."""
        async with watch.Watch(return_type="object") as stream:
            try:
                async for event in stream.stream(
                    self._core.list_pod_for_all_namespaces,
                    label_selector=SELECTOR,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_READ_TIMEOUT,
                ):
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        await self.apply(event["type"], event["raw_object"])
            except ApiException as error:
                if error.status == 410:
                    return None
                raise
            return str(stream.resource_version or version)

    async def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Every sandbox pod as listed: in step from now on."""
        async with self._changed:
            self.bindings.replace(pods)
            self.in_step = True
            self._changed.notify_all()

    async def apply(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """One watch event."""
        async with self._changed:
            self.bindings.apply(event_type, pod)
            self._changed.notify_all()

    async def _out_of_step(self) -> None:
        async with self._changed:
            self.in_step = False
            self._changed.notify_all()


def application(binder: Binder) -> web.Application:
    async def owners(request: web.Request) -> web.Response:
        peer = normal_address(request.remote or "")
        if peer is None or not ipaddress.ip_address(peer).is_loopback:
            return web.json_response({}, status=403)
        address = normal_address(request.match_info["address"])
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = 0.0
        found = await binder.owner(address, wait) if address else None
        if found is None:
            return web.json_response({}, status=404)
        return web.json_response({"namespace": found.namespace, "uid": found.uid})

    async def healthz(_: web.Request) -> web.Response:
        if binder.in_step:
            return web.Response(text="ok\n")
        return web.Response(text="listing the sandbox pods\n", status=503)

    app = web.Application()
    app.router.add_get("/owners/{address}", owners)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(host: str, port: int, kubeconfig: Path | None) -> None:
    async with await open_api_client(kubeconfig) as api_client:
        binder = Binder(CoreV1Api(api_client))
        runner = web.AppRunner(application(binder), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        try:
            await binder.run()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9182)
    parser.add_argument("--kubeconfig", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(serve(args.host, args.port, args.kubeconfig))


if __name__ == "__main__":
    main()
