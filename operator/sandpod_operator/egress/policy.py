"""Which destinations an egress allowlist may name: the platform's bounds, checked without I/O.

An entry inside a range the administrator opened is accepted as it is. Any other entry must
not overlap a non-public range (rule public-only) or one of the cluster's own ranges (rule
cluster-network). A namespace may be narrowed further: its entries must then lie inside one of
its ranges (rule tenant). The chart's ValidatingAdmissionPolicy (charts/sandpod/templates/
egress-policy.yaml) makes the same decision in CEL, in the same order, with the same words.
"""

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sandpod_contract.egress_grant import pattern_within
from sandpod_contract.non_public_ranges import NON_PUBLIC_RANGES

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PUBLIC_ONLY = "public-only"
CLUSTER_NETWORK = "cluster-network"
TENANT = "tenant"

RULE_REASONS = {
    PUBLIC_ONLY: "an allowlist may name only public addresses",
    CLUSTER_NETWORK: "the cluster's nodes, pods, services (DNS included) and API server "
    "are never reachable",
    TENANT: "an allowlist in this namespace may name only",
}
NO_PROXY_MESSAGE = (
    "spec.network.allow: host entries go through the egress proxy, and this installation "
    "runs none (operator setting egressProxyService)"
)

# The cluster's own ranges, by OperatorSettings field, and how a message names them.
CLUSTER_RANGE_KINDS: tuple[tuple[str, str], ...] = (
    ("egress_node_cidrs", "a node"),
    ("egress_pod_cidrs", "the pod network"),
    ("egress_service_cidrs", "the service network"),
    ("egress_api_server_cidrs", "the API server"),
)


def parse_network(text: str) -> IPNetwork:
    """A CIDR (or a bare address, as /32 or /128); host bits set are an error."""
    return ipaddress.ip_network(text, strict=True)


@dataclass(frozen=True)
class ExcludedRange:
    """A range allowlists may not name: `what` it is, for the refusal, and the `rule` that
    keeps it out (public-only or cluster-network)."""

    network: IPNetwork
    what: str
    rule: str


@dataclass(frozen=True)
class EgressBounds:
    """Everything the check needs: excluded ranges in order, opened ranges, narrowings."""

    excluded: tuple[ExcludedRange, ...]
    opened: tuple[IPNetwork, ...] = ()
    # Namespace -> the only ranges its allowlists may name (empty: none at all).
    narrowed: Mapping[str, tuple[IPNetwork, ...]] = field(default_factory=dict)
    # Namespace -> the only host patterns its allowlists may name (empty: none at all).
    narrowed_hosts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def make_bounds(
    cluster: Iterable[tuple[str, Iterable[str]]],
    opened: Iterable[str] = (),
    narrowed: Mapping[str, Sequence[str]] | None = None,
    narrowed_hosts: Mapping[str, Sequence[str]] | None = None,
) -> EgressBounds:
    """Bounds from text: cluster is (what, cidrs) pairs, e.g. ("the pod network", [...])."""
    excluded = [
        ExcludedRange(parse_network(cidr), what, PUBLIC_ONLY) for cidr, what in NON_PUBLIC_RANGES
    ]
    excluded += [
        ExcludedRange(parse_network(cidr), what, CLUSTER_NETWORK)
        for what, cidrs in cluster
        for cidr in cidrs
    ]
    return EgressBounds(
        excluded=tuple(excluded),
        opened=tuple(parse_network(cidr) for cidr in opened),
        narrowed={
            namespace: tuple(parse_network(cidr) for cidr in cidrs)
            for namespace, cidrs in (narrowed or {}).items()
        },
        narrowed_hosts={ns: tuple(hosts) for ns, hosts in (narrowed_hosts or {}).items()},
    )


def _inside(inner: IPNetwork, outer: IPNetwork) -> bool:
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _overlap(a: IPNetwork, b: IPNetwork) -> bool:
    return _inside(a, b) or _inside(b, a)


def _opened(network: IPNetwork, bounds: EgressBounds) -> bool:
    return any(_inside(network, opened) for opened in bounds.opened)


def refusal(cidrs: Sequence[str], bounds: EgressBounds, namespace: str) -> str | None:
    """Why this allowlist is outside the bounds (naming the entry, range and rule), or None."""
    networks = [(cidr, parse_network(cidr)) for cidr in cidrs]
    checked = [(cidr, network) for cidr, network in networks if not _opened(network, bounds)]
    for excluded in bounds.excluded:
        for cidr, network in checked:
            if _overlap(network, excluded.network):
                return (
                    f"spec.network.allow: {cidr} overlaps {excluded.network} ({excluded.what}); "
                    f"egress rule {excluded.rule}: {RULE_REASONS[excluded.rule]}"
                )
    if namespace not in bounds.narrowed:
        return None
    allowed = bounds.narrowed[namespace]
    for cidr, network in networks:
        if not any(_inside(network, outer) for outer in allowed):
            listed = ",".join(str(outer) for outer in allowed) or "nothing"
            return (
                f"spec.network.allow: {cidr} is outside this namespace's egress ranges; "
                f"egress rule {TENANT}: {RULE_REASONS[TENANT]} {listed}"
            )
    return None


def host_refusal(hosts: Sequence[str], bounds: EgressBounds, namespace: str) -> str | None:
    """Why these host entries are outside this namespace's hosts (rule tenant), or None."""
    if namespace not in bounds.narrowed_hosts:
        return None
    allowed = bounds.narrowed_hosts[namespace]
    for host in hosts:
        if not any(pattern_within(host, outer) for outer in allowed):
            listed = ",".join(allowed) or "no host"
            return (
                f"spec.network.allow: host {host} is outside this namespace's egress hosts; "
                f"egress rule {TENANT}: {RULE_REASONS[TENANT]} {listed}"
            )
    return None


def excepts(cidr: str, bounds: EgressBounds) -> list[str]:
    """The excluded ranges strictly inside an allowed entry, for its ipBlock's `except`
    (defence in depth: the check refuses such entries), none for an opened entry."""
    network = parse_network(cidr)
    if _opened(network, bounds):
        return []
    inside = {
        excluded.network
        for excluded in bounds.excluded
        if excluded.network != network and _inside(excluded.network, network)
    }
    # Ranges inside another listed range add nothing.
    return [
        str(net)
        for net in sorted(inside, key=lambda n: (n.version, n))
        if not any(other != net and _inside(net, other) for other in inside)
    ]
