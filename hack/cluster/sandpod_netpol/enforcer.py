"""The enforcer process: watch the API, keep the kernel's rules current, answer the CNI plugin.

Fail closed: the CNI plugin's ADD for a new pod is answered only once a ruleset
that knows the pod's IP is in the kernel, and pod-CIDR addresses the ruleset
does not know are dropped. Stopping the process leaves the rules in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from sandpod_netpol import kernel
from sandpod_netpol.kube import ApiError, ObjectStore, Reflector, read_json
from sandpod_netpol.rules import Ruleset, build_ruleset
from sandpod_netpol.selection import CniAttachment, NodeInfo, Object, PodKey, object_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnforcerConfig:
    kubeconfig: Path
    node_name: str
    pod_cidr: IPv4Network
    bridge: str
    socket_path: Path
    state_path: Path
    resync_seconds: float = 10.0
    debounce_seconds: float = 0.1
    cni_timeout_seconds: float = 55.0


class CniRequestError(RuntimeError):
    """A CNI request the enforcer cannot satisfy; the plugin fails the operation."""


def _request_fields(request: Mapping[str, Any], *names: str) -> list[str]:
    values = []
    for name in names:
        value = request.get(name)
        if not isinstance(value, str) or not value:
            raise CniRequestError(f"request field {name!r} is missing")
        values.append(value)
    return values


class Enforcer:
    def __init__(self, settings: EnforcerConfig, api: client.ApiClient) -> None:
        self.settings = settings
        self._core = client.CoreV1Api(api)
        self._networking = client.NetworkingV1Api(api)
        self.pods = ObjectStore()
        self.namespaces = ObjectStore()
        self.policies = ObjectStore()
        self.attachments: dict[PodKey, CniAttachment] = {}
        self._synced = asyncio.Event()
        self._dirty = asyncio.Event()
        self._urgent = asyncio.Event()
        self._applied = asyncio.Condition()
        self._version = 0  # bumped by every change of what the rules are built from
        self._applied_version = -1
        self._last_error: str | None = "no ruleset applied yet"
        self._last_ruleset: Ruleset | None = None
        self._last_apply = 0.0

    # --- state -------------------------------------------------------------

    def _changed(self, *, urgent: bool = False) -> int:
        self._version += 1
        self._dirty.set()
        if urgent:
            self._urgent.set()
        return self._version

    def _on_pod_event(self, kind: str, pod: Object | None) -> None:
        if kind == "DELETED" and pod is not None:
            key = object_key(pod)
            attachment = self.attachments.get(key)
            uid = (pod.get("metadata") or {}).get("uid")
            if attachment is not None and attachment.uid in (None, uid):
                del self.attachments[key]
                self._save_state()
        self._changed()

    def _on_event(self, kind: str, obj: Object | None) -> None:
        self._changed()

    def load_state(self) -> None:
        try:
            saved = json.loads(self.settings.state_path.read_text())
            self.attachments = {
                (entry["namespace"], entry["name"]): CniAttachment(
                    container_id=entry["containerId"],
                    ip=IPv4Address(entry["ip"]) if entry.get("ip") else None,
                    uid=entry.get("uid"),
                )
                for entry in saved.get("attachments", [])
            }
        except FileNotFoundError:
            return
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring unreadable state file %s: %s", self.settings.state_path, error)

    def _save_state(self) -> None:
        """Attachments survive a restart: a pod's status.podIP can lag its CNI ADD."""
        entries = [
            {
                "namespace": namespace,
                "name": name,
                "containerId": attachment.container_id,
                "ip": str(attachment.ip) if attachment.ip else None,
                "uid": attachment.uid,
            }
            for (namespace, name), attachment in sorted(self.attachments.items())
        ]
        path = self.settings.state_path
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps({"attachments": entries}, indent=1))
        os.replace(temporary, path)

    def _forget_departed_pods(self) -> None:
        departed = set(self.attachments) - self.pods.keys()
        if departed:
            for key in departed:
                del self.attachments[key]
            self._save_state()

    # --- applying ------------------------------------------------------------

    def desired_ruleset(self, addresses: frozenset[IPv4Address]) -> Ruleset:
        return build_ruleset(
            policies=self.policies.values(),
            pods=self.pods.values(),
            namespaces=self.namespaces.values(),
            node=NodeInfo(
                name=self.settings.node_name,
                pod_cidr=self.settings.pod_cidr,
                bridge=self.settings.bridge,
                addresses=addresses,
            ),
            attachments=self.attachments,
        )

    async def _apply_once(self) -> None:
        version = self._version
        resync = time.monotonic() - self._last_apply >= self.settings.resync_seconds
        try:
            ruleset = self.desired_ruleset(await asyncio.to_thread(kernel.node_addresses))
            if resync or ruleset != self._last_ruleset:
                await asyncio.to_thread(kernel.apply_ruleset, ruleset)
                if ruleset != self._last_ruleset:
                    log.info(
                        "applied ruleset: %d chains, %d ipsets",
                        len(ruleset.ipv4_chains),
                        len(ruleset.ipsets),
                    )
                self._last_ruleset = ruleset
                self._last_apply = time.monotonic()
                if resync:
                    self._forget_departed_pods()
        except kernel.CommandError as error:
            self._last_ruleset = None
            self._last_error = str(error)
            log.error("applying rules failed: %s", error)
            await asyncio.sleep(1.0)
            self._dirty.set()
            return
        async with self._applied:
            self._applied_version = max(self._applied_version, version)
            self._last_error = None
            self._applied.notify_all()

    async def _apply_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=self.settings.resync_seconds)
            if not self._urgent.is_set():
                # Let a burst of watch events settle; a pod waiting in CNI ADD cuts this short.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._urgent.wait(), timeout=self.settings.debounce_seconds
                    )
            self._dirty.clear()
            self._urgent.clear()
            await self._apply_once()

    async def _wait_applied(self, version: int, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with self._applied:
                await asyncio.wait_for(
                    self._applied.wait_for(lambda: self._applied_version >= version),
                    timeout=max(deadline - loop.time(), 0.0),
                )
        except TimeoutError:
            raise CniRequestError(f"rules not in place in time: {self._last_error}") from None

    # --- CNI requests ----------------------------------------------------------

    async def handle_cni(self, request: Mapping[str, Any]) -> dict[str, Any]:
        command = request.get("command")
        try:
            if command == "ADD":
                await self._cni_add(request)
            elif command == "DEL":
                self._cni_del(request)
            elif command == "CHECK":
                self._cni_check(request)
            else:
                raise CniRequestError(f"unknown command {command!r}")
        except CniRequestError as error:
            log.warning("CNI %s %s/%s refused: %s", command, *_pod_of(request), error)
            return {"ok": False, "error": str(error)}
        return {"ok": True}

    async def _cni_add(self, request: Mapping[str, Any]) -> None:
        namespace, name, container_id, ip_text = _request_fields(
            request, "namespace", "name", "containerId", "ip"
        )
        try:
            ip = IPv4Address(ip_text)
        except ValueError:
            raise CniRequestError(f"not an IPv4 address: {ip_text!r}") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.cni_timeout_seconds
        try:
            await asyncio.wait_for(self._synced.wait(), timeout=deadline - loop.time())
        except TimeoutError:
            raise CniRequestError("enforcer has not synced with the API server yet") from None
        try:
            # Fresh reads: the policies that select this pod must all be known before
            # it starts, even if the watch is lagging behind the API server.
            pod = await read_json(self._core.read_namespaced_pod, name, namespace)
            policies = await read_json(self._networking.list_namespaced_network_policy, namespace)
        except (ApiError, aiohttp.ClientError, TimeoutError) as error:
            raise CniRequestError(f"reading pod {namespace}/{name}: {error}") from None
        uid = (pod.get("metadata") or {}).get("uid")
        wanted_uid = request.get("uid")
        if wanted_uid and wanted_uid != uid:
            raise CniRequestError(
                f"pod {namespace}/{name} is no longer the one with uid {wanted_uid}"
            )
        self.pods.upsert(pod)
        for policy in policies.get("items") or []:
            self.policies.upsert(policy)
        self.attachments[(namespace, name)] = CniAttachment(container_id, ip, uid)
        self._save_state()
        await self._wait_applied(self._changed(urgent=True), deadline)
        log.info("pod %s/%s (%s) programmed", namespace, name, ip)

    def _cni_del(self, request: Mapping[str, Any]) -> None:
        namespace, name, container_id = _request_fields(request, "namespace", "name", "containerId")
        key = (namespace, name)
        attachment = self.attachments.get(key)
        # A DEL for an older sandbox of the pod must not undo a newer ADD.
        if attachment is None or attachment.container_id == container_id:
            self.attachments[key] = CniAttachment(
                container_id, None, attachment.uid if attachment else None
            )
            self._save_state()
            self._changed()

    def _cni_check(self, request: Mapping[str, Any]) -> None:
        namespace, name, container_id, ip_text = _request_fields(
            request, "namespace", "name", "containerId", "ip"
        )
        attachment = self.attachments.get((namespace, name))
        if (
            attachment is None
            or attachment.container_id != container_id
            or str(attachment.ip) != ip_text
        ):
            raise CniRequestError("the enforcer does not know this pod's network")
        if self._last_error is not None:
            raise CniRequestError(f"rules are not in place: {self._last_error}")

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=10)
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request is not a JSON object")
            response = await self.handle_cni(request)
        except (ValueError, TimeoutError) as error:
            response = {"ok": False, "error": f"bad request: {error}"}
        try:
            writer.write(json.dumps(response).encode() + b"\n")
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        except ConnectionError:
            log.warning("CNI plugin went away before its answer: %s", response)

    async def _start_server(self) -> asyncio.Server:
        path = self.settings.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_unix_connection(str(path))
                writer.close()
                raise RuntimeError(f"another enforcer is serving {path}")
            path.unlink()
        server = await asyncio.start_unix_server(self._serve_connection, path=str(path))
        path.chmod(0o600)
        return server

    # --- main --------------------------------------------------------------------

    async def run(self) -> None:
        kernel.ensure_bridge_netfilter()
        self.load_state()
        reflectors = [
            Reflector(
                "pods", self._core.list_pod_for_all_namespaces, self.pods, self._on_pod_event
            ),
            Reflector("namespaces", self._core.list_namespace, self.namespaces, self._on_event),
            Reflector(
                "networkpolicies",
                self._networking.list_network_policy_for_all_namespaces,
                self.policies,
                self._on_event,
            ),
        ]
        server = await self._start_server()
        log.info("serving the CNI plugin on %s", self.settings.socket_path)
        try:
            versions = await self._initial_sync(reflectors)
            self._forget_departed_pods()
            self._last_apply = 0.0
            await self._apply_once()
            self._synced.set()
            log.info("synced with the API server; enforcing on node %s", self.settings.node_name)
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._apply_loop())
                for reflector, version in zip(reflectors, versions, strict=True):
                    tasks.create_task(reflector.run(version))
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                self.settings.socket_path.unlink()

    async def _initial_sync(self, reflectors: list[Reflector]) -> list[str]:
        delay = 0.5
        while True:
            try:
                return [await reflector.relist() for reflector in reflectors]
            except (ApiError, aiohttp.ClientError, TimeoutError) as error:
                log.warning("listing from the API server failed (%s), retrying", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)


def _pod_of(request: Mapping[str, Any]) -> tuple[str, str]:
    return (str(request.get("namespace")), str(request.get("name")))


async def run_enforcer(settings: EnforcerConfig) -> None:
    api = await config.new_client_from_config(config_file=str(settings.kubeconfig))
    async with api:
        await Enforcer(settings, api).run()
