"""The egress proxy's binder: which live sandbox pod holds an address, and whom it was made for
(pure; against a real API server: tests/integration/test_grant_binding.py)."""

import asyncio
from typing import Any

from sandpod_contract.names import API_VERSION, KIND, SESSION_KIND
from sandpod_proxy.binder import Binder, Bindings, Owner, normal_address, pod_binding

EXECUTION_UID = "0a1b2c3d-0000-0000-0000-000000000001"


def sandbox_pod(
    uid: str = "pod-1",
    ip: str | None = "10.244.0.7",
    *,
    owner_uid: str = EXECUTION_UID,
    kind: str = KIND,
    api_version: str = API_VERSION,
    controller: bool = True,
    phase: str = "Running",
    **extra: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    reference = {"apiVersion": api_version, "kind": kind, "name": "x", "uid": owner_uid}
    return {
        "metadata": {
            "uid": uid,
            "namespace": "team-a",
            "ownerReferences": [reference | ({"controller": True} if controller else {})],
            **extra.pop("metadata", {}),
        },
        "spec": extra.pop("spec", {}),
        "status": status,
    }


def test_a_live_pod_binds_its_addresses_to_its_execution_or_session() -> None:
    owner = Owner("team-a", EXECUTION_UID)
    assert pod_binding(sandbox_pod()) == (owner, frozenset({"10.244.0.7"}))
    session = pod_binding(sandbox_pod(kind=SESSION_KIND, phase="Pending"))
    assert session == (owner, frozenset({"10.244.0.7"}))
    dual = sandbox_pod()
    dual["status"]["podIPs"].append({"ip": "fd00::7"})
    assert pod_binding(dual) == (owner, frozenset({"10.244.0.7", "fd00::7"}))


def test_pods_that_bind_nothing() -> None:
    for pod in (
        sandbox_pod(ip=None),  # no address yet
        sandbox_pod(phase="Succeeded"),  # its address is free again
        sandbox_pod(phase="Failed"),
        sandbox_pod(metadata={"deletionTimestamp": "2026-11-26T10:00:00Z"}),  # being deleted
        sandbox_pod(spec={"hostNetwork": True}),  # the node's address
        sandbox_pod(controller=False),  # an owner, not its controller
        sandbox_pod(kind="SandboxPool"),  # a free pool pod: no grant is made for it
        sandbox_pod(api_version="evil.dev/v1"),
        sandbox_pod(ip="not-an-address"),
    ):
        assert pod_binding(pod) is None, pod


def test_addresses_are_compared_as_addresses() -> None:
    assert normal_address("::ffff:10.244.0.7") == "10.244.0.7"  # as Squid may print IPv4
    assert normal_address("[fd00::0007]") == "fd00::7"
    assert normal_address("-") is None


def test_one_live_pod_per_address_else_nobody() -> None:
    bindings = Bindings()
    bindings.replace([sandbox_pod("pod-1")])
    assert bindings.owner("10.244.0.7") == Owner("team-a", EXECUTION_UID)
    # Another pod claims the same address (a stale entry, a forged pod): no one is trusted.
    bindings.apply("ADDED", sandbox_pod("pod-2", owner_uid="someone-else"))
    assert bindings.owner("10.244.0.7") is None
    bindings.apply("DELETED", sandbox_pod("pod-2", owner_uid="someone-else"))
    assert bindings.owner("10.244.0.7") == Owner("team-a", EXECUTION_UID)
    # The pod ends: its address binds nothing; a new pod at that address is its own owner's.
    bindings.apply("MODIFIED", sandbox_pod("pod-1", phase="Succeeded"))
    assert bindings.owner("10.244.0.7") is None
    bindings.apply("ADDED", sandbox_pod("pod-3", owner_uid="next"))
    assert bindings.owner("10.244.0.7") == Owner("team-a", "next")
    bindings.replace([])
    assert bindings.owner("10.244.0.7") is None and not bindings.pods


async def test_an_answer_waits_for_the_pod_and_never_comes_out_of_step() -> None:
    binder = Binder(core=None)  # type: ignore[arg-type]  # no API: fed by hand
    await binder.apply("ADDED", sandbox_pod())
    assert await binder.owner("10.244.0.7", wait=0) is None  # not yet in step with a list
    await binder.replace([])
    waiting = asyncio.create_task(binder.owner("10.244.0.7", wait=5))
    await asyncio.sleep(0)  # the lookup is waiting
    assert not waiting.done()
    await binder.apply("MODIFIED", sandbox_pod())
    assert await waiting == Owner("team-a", EXECUTION_UID)
    assert await binder.owner("10.244.0.9", wait=0.01) is None
