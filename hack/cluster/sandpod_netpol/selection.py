"""Pure views over Kubernetes objects: which pods exist where, and what policies select.

Objects are the plain JSON dicts the API server returns; nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

Object = Mapping[str, Any]
PodKey = tuple[str, str]  # (namespace, name)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
PROTOCOLS = frozenset({"TCP", "UDP", "SCTP"})
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class NodeInfo:
    """What the rules need to know about the node they are programmed on."""

    name: str
    pod_cidr: IPv4Network
    bridge: str
    addresses: frozenset[IPv4Address] = frozenset()


@dataclass(frozen=True)
class CniAttachment:
    """What the CNI plugin told us about a pod's network: the freshest source of its IP.

    ip is None once the network was torn down (CNI DEL) and not set up again.
    """

    container_id: str
    ip: IPv4Address | None
    uid: str | None = None


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    labels: Mapping[str, str]
    ip: IPv4Address
    local: bool
    # (protocol, port name) -> container port number
    named_ports: Mapping[tuple[str, str], int] = field(default_factory=dict)

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.name)


def object_key(obj: Object) -> PodKey:
    metadata = obj.get("metadata") or {}
    return (metadata.get("namespace") or "", metadata.get("name") or "")


def labels_of(obj: Object) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def selector_matches(selector: Object | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; a null selector matches nothing, {} matches everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression.get("key")
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator == "In":
            if key not in labels or labels[key] not in values:
                return False
        elif operator == "NotIn":
            if key in labels and labels[key] in values:
                return False
        elif operator == "Exists":
            if key not in labels:
                return False
        elif operator == "DoesNotExist":
            if key in labels:
                return False
        else:
            return False
    return True


def _named_ports(pod: Object) -> dict[tuple[str, str], int]:
    spec = pod.get("spec") or {}
    ports: dict[tuple[str, str], int] = {}
    # Sidecars are init containers; their ports are the pod's ports too.
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        for port in container.get("ports") or []:
            name = port.get("name")
            number = port.get("containerPort")
            if name and isinstance(number, int):
                ports.setdefault((port.get("protocol") or "TCP", name), number)
    return ports


def _status_ipv4(pod: Object) -> IPv4Address | None:
    status = pod.get("status") or {}
    candidates = [entry.get("ip") for entry in status.get("podIPs") or []]
    candidates.append(status.get("podIP"))
    for candidate in candidates:
        if not candidate:
            continue
        try:
            address = ipaddress.ip_address(candidate)
        except ValueError:
            continue
        if isinstance(address, IPv4Address):
            return address
    return None


def pod_views(
    pods: Iterable[Object],
    attachments: Mapping[PodKey, CniAttachment],
    node_name: str,
) -> list[PodView]:
    """Pods that own a pod-network IPv4 address right now, one pod per address.

    A CNI attachment (seen on this node) wins over status.podIP, which the
    kubelet reports only later. hostNetwork pods and finished pods own no pod IP.
    When two pods claim one address (an IP reused before the old pod's status
    caught up), the attached one wins, then the newer one.
    """
    claims: dict[IPv4Address, tuple[tuple[int, str], PodView]] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        metadata = pod.get("metadata") or {}
        if spec.get("hostNetwork") or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        key = object_key(pod)
        attachment = attachments.get(key)
        if attachment is not None and attachment.uid not in (None, metadata.get("uid")):
            attachment = None
        if attachment is not None:
            ip, local = attachment.ip, True
        else:
            ip, local = _status_ipv4(pod), spec.get("nodeName") == node_name
        if ip is None:
            continue
        view = PodView(
            namespace=key[0],
            name=key[1],
            labels=labels_of(pod),
            ip=ip,
            local=local,
            named_ports=_named_ports(pod),
        )
        rank = (1 if attachment is not None else 0, metadata.get("creationTimestamp") or "")
        if ip not in claims or rank > claims[ip][0]:
            claims[ip] = (rank, view)
    return sorted((view for _, view in claims.values()), key=lambda view: view.key)


@dataclass(frozen=True)
class PortSpec:
    protocol: str
    port: int | str | None  # number, name, or None for every port
    end_port: int | None = None


@dataclass(frozen=True)
class PodPeer:
    """podSelector and/or namespaceSelector; None means the field was not set."""

    pod_selector: Object | None
    namespace_selector: Object | None


@dataclass(frozen=True)
class IpBlockPeer:
    cidr: str
    excepts: tuple[str, ...]


Peer = PodPeer | IpBlockPeer


@dataclass(frozen=True)
class PolicyRule:
    peers: tuple[Peer, ...] | None  # None: every peer
    ports: tuple[PortSpec, ...] | None  # None: every port and protocol


@dataclass(frozen=True)
class PolicyView:
    namespace: str
    name: str
    pod_selector: Object
    ingress: tuple[PolicyRule, ...] | None  # None: the policy does not govern ingress
    egress: tuple[PolicyRule, ...] | None


def _peer(raw: Object) -> Peer | None:
    if "ipBlock" in raw and raw["ipBlock"] is not None:
        block = raw["ipBlock"]
        return IpBlockPeer(cidr=block.get("cidr") or "", excepts=tuple(block.get("except") or []))
    pod_selector = raw.get("podSelector")
    namespace_selector = raw.get("namespaceSelector")
    if pod_selector is None and namespace_selector is None:
        return None
    return PodPeer(pod_selector=pod_selector, namespace_selector=namespace_selector)


def _port(raw: Object) -> PortSpec:
    port = raw.get("port")
    end_port = raw.get("endPort")
    return PortSpec(
        protocol=raw.get("protocol") or "TCP",
        port=port,
        end_port=end_port if isinstance(port, int) and isinstance(end_port, int) else None,
    )


def _rules(raw_rules: Iterable[Object], peers_field: str) -> tuple[PolicyRule, ...]:
    rules = []
    for raw in raw_rules:
        raw_peers = raw.get(peers_field) or []
        raw_ports = raw.get("ports") or []
        # A peer the API would not accept (neither field set) matches nothing.
        peers = tuple(peer for peer in map(_peer, raw_peers) if peer is not None)
        rules.append(
            PolicyRule(
                peers=peers if raw_peers else None,
                ports=tuple(_port(port) for port in raw_ports) if raw_ports else None,
            )
        )
    return tuple(rules)


def policy_view(policy: Object) -> PolicyView:
    """Parse a NetworkPolicy, applying the API's policyTypes defaulting."""
    namespace, name = object_key(policy)
    spec = policy.get("spec") or {}
    raw_ingress = spec.get("ingress") or []
    raw_egress = spec.get("egress") or []
    types = set(spec.get("policyTypes") or [])
    if not types:
        types = {"Ingress", "Egress"} if raw_egress else {"Ingress"}
    pod_selector = spec.get("podSelector")
    return PolicyView(
        namespace=namespace,
        name=name,
        pod_selector=pod_selector if pod_selector is not None else {},
        ingress=_rules(raw_ingress, "from") if "Ingress" in types else None,
        egress=_rules(raw_egress, "to") if "Egress" in types else None,
    )


def namespace_labels(namespaces: Iterable[Object]) -> dict[str, Mapping[str, str]]:
    return {object_key(namespace)[1]: labels_of(namespace) for namespace in namespaces}


def labels_of_namespace(
    labels_by_namespace: Mapping[str, Mapping[str, str]], name: str
) -> Mapping[str, str]:
    # A namespace we have not seen yet still carries its automatic name label.
    return labels_by_namespace.get(name) or {NAMESPACE_NAME_LABEL: name}


def peer_pods(
    peer: PodPeer,
    policy_namespace: str,
    pods: Iterable[PodView],
    labels_by_namespace: Mapping[str, Mapping[str, str]],
) -> list[PodView]:
    """Pods a podSelector/namespaceSelector peer of a policy in policy_namespace stands for."""
    matched = []
    for pod in pods:
        if peer.namespace_selector is None:
            if pod.namespace != policy_namespace:
                continue
        elif not selector_matches(
            peer.namespace_selector, labels_of_namespace(labels_by_namespace, pod.namespace)
        ):
            continue
        if peer.pod_selector is not None and not selector_matches(peer.pod_selector, pod.labels):
            continue
        matched.append(pod)
    return matched


def ipv4_network(text: str) -> IPv4Network | None:
    """An IPv4 CIDR from a policy, or None for IPv6 or garbage (which match no IPv4 traffic)."""
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None
    return network if isinstance(network, IPv4Network) else None


def ip_block_contains(peer: IpBlockPeer, address: IPv4Address) -> bool:
    network = ipv4_network(peer.cidr)
    if network is None or address not in network:
        return False
    for excepted in peer.excepts:
        excepted_network = ipv4_network(excepted)
        if excepted_network is not None and address in excepted_network:
            return False
    return True
