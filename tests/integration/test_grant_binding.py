"""Grants bound to their sandbox: the egress proxy's binder and grant helper, as the chart runs
them (two processes, the helper spoken to as Squid speaks to it), against a real, private
etcd + kube-apiserver. The test plays the operator (executions, sessions and their pods) and
the kubelet (pod addresses); Squid itself is exercised by the grant tests at the end of
tests/hostile/test_egress_by_host_name.py.
"""

from __future__ import annotations

import base64
import itertools
import json
import queue
import subprocess
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandpod_contract.egress_grant import Grant, HostGrant, sign
from sandpod_contract.names import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    ROLE_LABEL,
    SANDBOX_ROLE,
    SESSION_KIND,
    SESSION_PLURAL,
)
from sandpod_testkit.apiserver import PrivateApiServer, require_kube_bin_dir
from sandpod_testkit.paths import CRDS_DIR, VENV_BIN
from sandpod_testkit.processes import ChildProcess, free_port, http_ok
from sandpod_testkit.waiting import wait_until

KEY = b"integration-test-key-0123456789abcdef"
HOST, PORT = "allowed.example", "80"
# How long the helper waits for the binder to learn an address (the chart's default is longer).
WAIT_SECONDS = 1.0
ANSWER_SECONDS = 30.0


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateApiServer]:
    server = PrivateApiServer(require_kube_bin_dir(), tmp_path_factory.mktemp("apiserver"))
    try:
        server.start()
        for plural in (PLURAL, SESSION_PLURAL):
            server.kubectl("apply", "-f", str(CRDS_DIR / f"{plural}.{GROUP}.yaml"))
            server.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.{GROUP}"
            )
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def binder(api_server: PrivateApiServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """sandpod-proxy-binder on a port of its own; its base URL once it has listed the pods."""
    port = free_port()
    command = [
        str(VENV_BIN / "sandpod-proxy-binder"),
        f"--port={port}",
        f"--kubeconfig={api_server.kubeconfig}",
    ]
    log = tmp_path_factory.mktemp("binder") / "binder.log"
    process = ChildProcess("the binder", command, None, log)
    process.spawn()
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_ready(lambda: http_ok(f"{url}/healthz"), timeout=30, what="the binder")
        yield url
    finally:
        process.stop()


class Helper:
    """sandpod-proxy-grant-helper as Squid runs it: lines in with a channel, answers out by
    channel, in any order."""

    def __init__(
        self, binder: str, key_file: Path, *, wait: float = WAIT_SECONDS, server_name: bool = False
    ) -> None:
        command = [
            str(VENV_BIN / "sandpod-proxy-grant-helper"),
            f"--binder={binder}",
            f"--binding-wait={wait}",
            *(["--server-name"] if server_name else []),
            str(key_file),
        ]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.answers: queue.Queue[str] = queue.Queue()
        self.channels = itertools.count()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(line.rstrip("\n"))

    def send(self, token: str, client: str, *extra: str) -> str:
        """Sends one request line; its channel."""
        channel = str(next(self.channels))
        header = "Basic " + base64.b64encode(f"sandpod:{token}".encode()).decode()
        fields = [urllib.parse.quote(f, safe="") for f in (header, HOST, PORT, client, *extra)]
        assert self.process.stdin is not None
        self.process.stdin.write(f"{channel} {' '.join(fields)} -\n")
        self.process.stdin.flush()
        return channel

    def answer(self, channel: str) -> str:
        """The answer on `channel` (others that come first are put back)."""
        others = []
        try:
            while True:
                got, _, answer = self.answers.get(timeout=ANSWER_SECONDS).partition(" ")
                if got == channel:
                    return answer
                others.append(f"{got} {answer}")
        finally:
            for line in others:
                self.answers.put(line)

    def ask(self, token: str, client: str, *extra: str) -> str:
        return self.answer(self.send(token, client, *extra))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def helper(binder: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helper]:
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_bytes(KEY)
    running = Helper(binder, key_file)
    yield running
    running.close()


class Cluster:
    """The operator's and the kubelet's parts, by kubectl: owners, their pods, addresses."""

    def __init__(self, server: PrivateApiServer) -> None:
        self.server = server
        self.addresses = (f"10.244.{n // 250}.{n % 250 + 1}" for n in itertools.count())

    def namespace(self) -> str:
        name = f"grants-{uuid.uuid4().hex[:6]}"
        self.server.kubectl("create", "namespace", name)
        self.server.kubectl("create", "serviceaccount", "default", "-n", name)
        return name

    def owner(self, namespace: str, kind: str = KIND) -> dict[str, str]:
        """A CodeExecution (or CodeSession) as the API server has it: its reference."""
        name = f"{kind.lower()}-{uuid.uuid4().hex[:6]}"
        spec: dict[str, Any] = {"language": "python"}
        if kind == KIND:
            spec["source"] = "print(1)"
        self.server.apply(
            {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name,
             "namespace": namespace}, "spec": spec}
        )  # fmt: skip
        plural = PLURAL if kind == KIND else SESSION_PLURAL
        uid = self.server.kubectl(
            "get", f"{plural}.{GROUP}", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
        )
        return {"apiVersion": API_VERSION, "kind": kind, "name": name, "uid": uid}

    def pod(self, namespace: str, owner: dict[str, str]) -> str:
        """The owner's sandbox pod (made by the operator: its controller), not started."""
        name = f"sandbox-{uuid.uuid4().hex[:6]}"
        self.server.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {ROLE_LABEL: SANDBOX_ROLE},
                    "ownerReferences": [owner | {"controller": True}],
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "runner", "image": "none"}],
                },
            }
        )
        return name

    def start(
        self, namespace: str, pod: str, address: str | None = None, phase: str = "Running"
    ) -> str:
        """The kubelet's word: the pod is at `address` (else a new one, returned)."""
        address = address or next(self.addresses)
        status = {"phase": phase, "podIP": address, "podIPs": [{"ip": address}]}
        self.server.kubectl(
            "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        return address

    def delete(self, namespace: str, pod: str) -> None:
        self.server.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")


def forgotten(binder: str, address: str) -> None:
    """Waits until the binder no longer binds `address` (its watch saw the pod go)."""
    wait_until(
        lambda: not http_ok(f"{binder}/owners/{address}"), timeout=30, what=f"{address} unbound"
    )


@pytest.fixture(scope="module")
def cluster(api_server: PrivateApiServer) -> Cluster:
    return Cluster(api_server)


def token_for(owner: dict[str, str], namespace: str) -> str:
    grant = Grant(owner["uid"], namespace, 2**40, (HostGrant(HOST, (int(PORT),)),))
    return sign(grant, KEY)


def test_a_grant_counts_only_from_the_pod_it_was_issued_to(
    binder: str, cluster: Cluster, helper: Helper
) -> None:
    """Two tenants: a's grant works from a's pod, never from b's pod or an unknown address;
    b's own grant works from b's pod; a's grant ends with a's pod."""
    tenant_a, tenant_b = cluster.namespace(), cluster.namespace()
    execution_a, execution_b = cluster.owner(tenant_a), cluster.owner(tenant_b)
    pod_a, pod_b = cluster.pod(tenant_a, execution_a), cluster.pod(tenant_b, execution_b)
    address_a, address_b = cluster.start(tenant_a, pod_a), cluster.start(tenant_b, pod_b)
    grant_a, grant_b = token_for(execution_a, tenant_a), token_for(execution_b, tenant_b)

    assert helper.ask(grant_a, address_a) == f"OK log={execution_a['uid']}/{tenant_a}"
    assert helper.ask(grant_a, address_b) == "ERR"
    assert helper.ask(grant_b, address_b) == f"OK log={execution_b['uid']}/{tenant_b}"
    assert helper.ask(grant_b, address_a) == "ERR"
    assert helper.ask(grant_a, "10.244.250.250") == "ERR"
    assert helper.ask(grant_a, f"::ffff:{address_a}") == f"OK log={execution_a['uid']}/{tenant_a}"

    cluster.delete(tenant_a, pod_a)
    forgotten(binder, address_a)
    assert helper.ask(grant_a, address_a) == "ERR"
    assert helper.ask(grant_b, address_b) == f"OK log={execution_b['uid']}/{tenant_b}"


def test_a_sessions_grant_ends_with_the_session(
    binder: str, cluster: Cluster, helper: Helper
) -> None:
    """The operator deletes a session's pod when the session ends: its grant is refused from
    then on, also from a new pod (of another tenant) given the same address."""
    tenant_a, tenant_b = cluster.namespace(), cluster.namespace()
    session = cluster.owner(tenant_a, SESSION_KIND)
    pod = cluster.pod(tenant_a, session)
    address = cluster.start(tenant_a, pod)
    grant = token_for(session, tenant_a)
    assert helper.ask(grant, address) == f"OK log={session['uid']}/{tenant_a}"

    cluster.delete(tenant_a, pod)
    forgotten(binder, address)
    assert helper.ask(grant, address) == "ERR"
    execution_b = cluster.owner(tenant_b)
    pod_b = cluster.pod(tenant_b, execution_b)
    cluster.start(tenant_b, pod_b, address)
    assert helper.ask(token_for(execution_b, tenant_b), address).startswith("OK")
    assert helper.ask(grant, address) == "ERR"


def test_a_pods_first_request_waits_for_its_address(
    binder: str, cluster: Cluster, tmp_path: Path
) -> None:
    """A program may ask before the kubelet's report of its address reached the API server:
    the helper waits for the binder to learn it, answering other requests meanwhile."""
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    patient = Helper(binder, key_file, wait=ANSWER_SECONDS / 2, server_name=True)
    try:
        tenant = cluster.namespace()
        early_owner, other_owner = cluster.owner(tenant), cluster.owner(tenant)
        early_pod, other_pod = cluster.pod(tenant, early_owner), cluster.pod(tenant, other_owner)
        other_address = cluster.start(tenant, other_pod)
        early_grant = token_for(early_owner, tenant)
        early_address = next(cluster.addresses)
        early = patient.send(early_grant, early_address, HOST)
        other = patient.ask(token_for(other_owner, tenant), other_address, HOST)
        assert other.startswith(f"OK log={other_owner['uid']}/{tenant} ")  # answered meanwhile
        cluster.start(tenant, early_pod, early_address, phase="Pending")
        assert patient.answer(early).startswith(f"OK log={early_owner['uid']}/{tenant} ")
    finally:
        patient.close()
