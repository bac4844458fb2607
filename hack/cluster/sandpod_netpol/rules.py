"""Pure translation of NetworkPolicies, pods and namespaces into iptables and ipset input.

Layout of the filter table (IPv4), all chains ours (prefix SANDPOD-NP):

    FORWARD -> SANDPOD-NP-FORWARD     pod <-> pod (bridged) and pod <-> outside (routed)
        replies of allowed connections      RETURN
        unknown pod-CIDR source/destination DROP  (fail closed for pods not programmed yet)
        -> SANDPOD-NP-EGRESS           -s <pod ip> -g SANDPOD-NP-E-<hash>   (egress-isolated pods)
        -> SANDPOD-NP-INGRESS          -d <pod ip> -g SANDPOD-NP-I-<hash>   (ingress-isolated pods)
    INPUT -> SANDPOD-NP-INPUT         pod -> the node itself (API server, DNS on the host)
        replies RETURN, unknown pod-CIDR source DROP, -> SANDPOD-NP-EGRESS

A per-pod chain RETURNs what some policy allows and REJECTs the rest; RETURN
hands the packet back to the rest of the firewall (kube-proxy etc.) unchanged,
so the enforcer only ever takes traffic away. Per-pod chains and ipsets are
named by a hash of their content, so pods with the same rules share them and a
changed set is a new set that the iptables transaction switches to atomically.

Traffic from the node to pods (kubelet probes) leaves through OUTPUT and never
crosses FORWARD, so it is always allowed; the node's replies to pods are
replies. IPv6: the pod network is IPv4-only, so every IPv6 packet from the
bridge is dropped; otherwise pods could reach each other and the node's
services over link-local addresses that no policy can name.
"""

from __future__ import annotations

import hashlib
import itertools
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Literal

from sandpod_netpol.selection import (
    PROTOCOLS,
    CniAttachment,
    IpBlockPeer,
    NodeInfo,
    Object,
    PodKey,
    PodPeer,
    PodView,
    PolicyRule,
    PolicyView,
    PortSpec,
    ip_block_contains,
    ipv4_network,
    namespace_labels,
    peer_pods,
    pod_views,
    policy_view,
    selector_matches,
)

PREFIX = "SANDPOD-NP"
FORWARD_CHAIN = f"{PREFIX}-FORWARD"
INPUT_CHAIN = f"{PREFIX}-INPUT"
EGRESS_CHAIN = f"{PREFIX}-EGRESS"
INGRESS_CHAIN = f"{PREFIX}-INGRESS"
# builtin chain -> our chain hooked into it at position 1
HOOKS = {"FORWARD": FORWARD_CHAIN, "INPUT": INPUT_CHAIN}
HOOK_COMMENT = "sandpod-netpol"

Family = Literal[4, 6]
Direction = Literal["ingress", "egress"]

ESTABLISHED = "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
# Refused fast rather than left to time out, so a sandboxed program does not spend its run
# waiting. TCP gets a reset (ICMP errors are rate-limited per destination), except through
# a DNAT (a service IP): the kernel sends resets for bridged packets straight to the wire,
# skipping the reverse NAT, so those and everything else get ICMP port-unreachable, which
# gVisor's netstack understands (it ignores the "administratively prohibited" codes).
REJECT_RULES = (
    "-p tcp -m conntrack ! --ctstate DNAT -j REJECT --reject-with tcp-reset",
    "-j REJECT --reject-with icmp-port-unreachable",
)


@dataclass(frozen=True)
class IpSet:
    name: str
    kind: Literal["hash:ip", "hash:net"]
    entries: tuple[str, ...]  # "10.0.0.0/8", "10.1.0.0/16 nomatch", "10.244.0.5"


@dataclass(frozen=True)
class Ruleset:
    """Everything the enforcer wants in the kernel; chains map to rule specs without "-A chain"."""

    ipv4_chains: Mapping[str, tuple[str, ...]]
    ipv6_chains: Mapping[str, tuple[str, ...]]
    ipsets: tuple[IpSet, ...]

    def chains(self, family: Family) -> Mapping[str, tuple[str, ...]]:
        return self.ipv4_chains if family == 4 else self.ipv6_chains

    def ipset_restore_text(self) -> str:
        """`ipset restore` input that creates every set; content-named, so re-running is a no-op."""
        lines = []
        for ipset in self.ipsets:
            lines.append(f"create {ipset.name} {ipset.kind} family inet -exist")
            lines.extend(f"add {ipset.name} {entry} -exist" for entry in ipset.entries)
        return "".join(f"{line}\n" for line in lines)

    def iptables_restore_text(
        self,
        family: Family,
        *,
        stale_chains: Iterable[str] = (),
        hook_commands: Sequence[str] = (),
    ) -> str:
        """`iptables-restore --noflush` input: one transaction that replaces all our chains.

        Declaring a chain flushes it; stale chains (ours, no longer wanted) are
        flushed and then deleted once nothing refers to them any more.
        """
        chains = self.chains(family)
        stale = sorted(set(stale_chains) - set(chains))
        lines = ["*filter"]
        lines.extend(f":{name} - [0:0]" for name in [*chains, *stale])
        lines.extend(hook_commands)
        for name, rules in chains.items():
            lines.extend(f"-A {name} {rule}" for rule in rules)
        lines.extend(f"-X {name}" for name in stale)
        lines.append("COMMIT")
        return "".join(f"{line}\n" for line in lines)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class _IpSets:
    """Collects the sets rules refer to, named by content."""

    def __init__(self) -> None:
        self._sets: dict[str, IpSet] = {}

    def name_for(self, kind: Literal["hash:ip", "hash:net"], entries: Iterable[str]) -> str:
        ordered = tuple(sorted(set(entries)))
        name = f"{PREFIX}-{_digest(kind, *ordered)[:16]}"
        self._sets[name] = IpSet(name=name, kind=kind, entries=ordered)
        return name

    def all(self) -> tuple[IpSet, ...]:
        return tuple(self._sets[name] for name in sorted(self._sets))


def ip_block_entries(peer: IpBlockPeer) -> list[str]:
    """hash:net entries for cidr-minus-excepts: the cidr matches, each except is `nomatch`.

    hash:net cannot hold /0, so 0.0.0.0/0 becomes its two halves.
    """
    network = ipv4_network(peer.cidr)
    if network is None:
        return []
    pieces: list[IPv4Network] = list(network.subnets(1)) if network.prefixlen == 0 else [network]
    exceptions: set[IPv4Network] = set()
    for text in peer.excepts:
        excepted = ipv4_network(text)
        if excepted is None:
            continue
        pieces = [piece for piece in pieces if not piece.subnet_of(excepted)]
        exceptions.update(
            excepted for piece in pieces if excepted != piece and excepted.subnet_of(piece)
        )
    if not pieces:
        return []
    return [str(piece) for piece in pieces] + [f"{excepted} nomatch" for excepted in exceptions]


def _port_match(protocol: str, port: int, end_port: int | None = None) -> str:
    proto = protocol.lower()
    ports = f"{port}:{end_port}" if end_port is not None and end_port > port else str(port)
    return f"-p {proto} -m {proto} --dport {ports}"


class _PodChains:
    """Builds the per-pod chain bodies for one direction."""

    def __init__(
        self,
        direction: Direction,
        pods: Sequence[PodView],
        labels_by_namespace: Mapping[str, Mapping[str, str]],
        ipsets: _IpSets,
    ) -> None:
        self.direction = direction
        self.pods = pods
        self.labels_by_namespace = labels_by_namespace
        self.ipsets = ipsets
        # For ingress the peer is the packet's source, for egress its destination.
        self.peer_side = "src" if direction == "ingress" else "dst"

    def body(self, target: PodView, policies: Sequence[PolicyView]) -> tuple[str, ...]:
        allowed: set[str] = set()
        for policy in policies:
            rules = policy.ingress if self.direction == "ingress" else policy.egress
            for rule in rules or ():
                allowed.update(self._rule(rule, policy.namespace, target))
        return (*sorted(allowed), *REJECT_RULES)

    def _rule(self, rule: PolicyRule, namespace: str, target: PodView) -> list[str]:
        port_matches: list[str] = []
        named_ports: list[PortSpec] = []
        if rule.ports is None:
            port_matches.append("")
        for port in rule.ports or ():
            if port.protocol not in PROTOCOLS:
                continue
            if port.port is None:
                port_matches.append(f"-p {port.protocol.lower()}")
            elif isinstance(port.port, int):
                port_matches.append(_port_match(port.protocol, port.port, port.end_port))
            else:
                named_ports.append(port)
        if self.direction == "ingress":
            # A named port means the port of that name on the pod receiving the traffic.
            port_matches.extend(
                _port_match(port.protocol, target.named_ports[(port.protocol, str(port.port))])
                for port in named_ports
                if (port.protocol, str(port.port)) in target.named_ports
            )
        specs = [
            " ".join(part for part in (peer, ports, "-j RETURN") if part)
            for peer in (self._peer_matches(rule, namespace) if port_matches else [])
            for ports in port_matches
        ]
        if self.direction == "egress" and named_ports:
            specs.extend(self._egress_named_port_rules(rule, namespace, named_ports))
        return specs

    def _peer_matches(self, rule: PolicyRule, namespace: str) -> list[str]:
        if rule.peers is None:
            return [""]
        matches = []
        for peer in rule.peers:
            if isinstance(peer, PodPeer):
                ips = [
                    str(pod.ip)
                    for pod in peer_pods(peer, namespace, self.pods, self.labels_by_namespace)
                ]
                if not ips:
                    continue
                name = self.ipsets.name_for("hash:ip", ips)
            else:
                entries = ip_block_entries(peer)
                if not entries:
                    continue
                name = self.ipsets.name_for("hash:net", entries)
            matches.append(f"-m set --match-set {name} {self.peer_side}")
        return matches

    def _egress_named_port_rules(
        self, rule: PolicyRule, namespace: str, named_ports: Sequence[PortSpec]
    ) -> list[str]:
        """Named ports resolve on each destination pod the rule's peers stand for."""
        specs = []
        for destination in self._egress_candidates(rule, namespace):
            for port in named_ports:
                number = destination.named_ports.get((port.protocol, str(port.port)))
                if number is not None:
                    specs.append(
                        f"-d {destination.ip}/32 {_port_match(port.protocol, number)} -j RETURN"
                    )
        return specs

    def _egress_candidates(self, rule: PolicyRule, namespace: str) -> list[PodView]:
        if rule.peers is None:
            return list(self.pods)
        candidates: dict[PodKey, PodView] = {}
        for peer in rule.peers:
            if isinstance(peer, PodPeer):
                matched = peer_pods(peer, namespace, self.pods, self.labels_by_namespace)
            else:
                matched = [pod for pod in self.pods if ip_block_contains(peer, pod.ip)]
            candidates.update((pod.key, pod) for pod in matched)
        return [candidates[key] for key in sorted(candidates)]


def build_ruleset(
    *,
    policies: Iterable[Object],
    pods: Iterable[Object],
    namespaces: Iterable[Object],
    node: NodeInfo,
    attachments: Mapping[PodKey, CniAttachment] | None = None,
) -> Ruleset:
    """The complete desired kernel state for this node, from API objects alone."""
    views = pod_views(pods, attachments or {}, node.name)
    policy_views = sorted(
        (policy_view(policy) for policy in policies), key=lambda p: (p.namespace, p.name)
    )
    labels_by_namespace = namespace_labels(namespaces)
    ipsets = _IpSets()
    pod_chains: dict[str, tuple[str, ...]] = {}
    dispatch: dict[Direction, tuple[str, ...]] = {}
    for direction in ("egress", "ingress"):
        builder = _PodChains(direction, views, labels_by_namespace, ipsets)
        chains, dispatch[direction] = _isolate(builder, policy_views)
        pod_chains.update(chains)
    return Ruleset(
        ipv4_chains={
            **_ipv4_top_chains(node, views, ipsets, dispatch),
            **dict(sorted(pod_chains.items())),
        },
        ipv6_chains=_ipv6_chains(node.bridge),
        ipsets=ipsets.all(),
    )


def _isolate(
    builder: _PodChains, policies: Sequence[PolicyView]
) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The chains of the local pods that some policy isolates in the builder's direction
    (named by content) and the dispatch rules that send each pod's packets to its chain."""
    direction = builder.direction
    chains: dict[str, tuple[str, ...]] = {}
    dispatch: list[str] = []
    for pod in builder.pods:
        selecting = _selecting(policies, pod, direction) if pod.local else []
        if not selecting:
            continue  # not isolated in this direction
        body = builder.body(pod, selecting)
        chain = f"{PREFIX}-{'I' if direction == 'ingress' else 'E'}-{_digest(*body)[:15]}"
        chains[chain] = body
        match = "-d" if direction == "ingress" else "-s"
        dispatch.append(
            f"{match} {pod.ip}/32 -m comment --comment {pod.namespace}/{pod.name} -g {chain}"
        )
    return chains, tuple(dispatch)


def _selecting(
    policies: Sequence[PolicyView], pod: PodView, direction: Direction
) -> list[PolicyView]:
    """The policies that select the pod and have rules in that direction."""
    return [
        policy
        for policy in policies
        if policy.namespace == pod.namespace
        and (policy.ingress if direction == "ingress" else policy.egress) is not None
        and selector_matches(policy.pod_selector, pod.labels)
    ]


def _ipv4_top_chains(
    node: NodeInfo,
    views: Sequence[PodView],
    ipsets: _IpSets,
    dispatch: Mapping[Direction, tuple[str, ...]],
) -> dict[str, tuple[str, ...]]:
    """The hooked chains: replies pass, unknown pod-CIDR addresses drop, the rest dispatch."""
    known = ipsets.name_for(
        "hash:ip",
        [str(pod.ip) for pod in views if pod.local]
        + [str(address) for address in node.addresses if address in node.pod_cidr],
    )
    cidr = str(node.pod_cidr)
    return {
        FORWARD_CHAIN: (
            ESTABLISHED,
            f"-s {cidr} -m set ! --match-set {known} src -j DROP",
            f"-d {cidr} -m set ! --match-set {known} dst -j DROP",
            f"-j {EGRESS_CHAIN}",
            f"-j {INGRESS_CHAIN}",
        ),
        INPUT_CHAIN: (
            ESTABLISHED,
            f"-s {cidr} -m set ! --match-set {known} src -j DROP",
            f"-j {EGRESS_CHAIN}",
        ),
        EGRESS_CHAIN: dispatch["egress"],
        INGRESS_CHAIN: dispatch["ingress"],
    }


def _ipv6_chains(bridge: str) -> dict[str, tuple[str, ...]]:
    """Every IPv6 packet from the bridge drops (the pod network is IPv4-only)."""
    return {
        FORWARD_CHAIN: (f"-i {bridge} -j DROP", f"-o {bridge} -j DROP"),
        INPUT_CHAIN: (
            ESTABLISHED,
            # Neighbour discovery only, so the node's own IPv6 towards the bridge keeps working.
            f"-i {bridge} -p ipv6-icmp -m icmp6 --icmpv6-type 135 -j RETURN",
            f"-i {bridge} -p ipv6-icmp -m icmp6 --icmpv6-type 136 -j RETURN",
            f"-i {bridge} -j DROP",
        ),
    }


def hook_rule(builtin: str) -> str:
    return f"-m comment --comment {HOOK_COMMENT} -j {HOOKS[builtin]}"


def _jump_target(rule: str) -> str | None:
    tokens = shlex.split(rule)
    for flag, target in itertools.pairwise(tokens):
        if flag in ("-j", "-g"):
            return target
    return None


def hook_commands(builtin: str, saved_rules: Sequence[str]) -> list[str]:
    """restore commands that leave exactly one jump to our chain, at position 1 of builtin.

    saved_rules are builtin's "-A builtin ..." lines from iptables-save, in order.
    Other components (kube-proxy) prepend their own jumps; being first matters
    because they ACCEPT some traffic outright.
    """
    ours = [rule for rule in saved_rules if _jump_target(rule) == HOOKS[builtin]]
    wanted = f"-A {builtin} {hook_rule(builtin)}"
    if saved_rules and saved_rules[0] == wanted and len(ours) == 1:
        return []
    prefix = f"-A {builtin} "
    return [f"-D {builtin} {rule.removeprefix(prefix)}" for rule in ours] + [
        f"-I {builtin} 1 {hook_rule(builtin)}"
    ]


@dataclass(frozen=True)
class SavedTable:
    chains: tuple[str, ...]
    rules: Mapping[str, tuple[str, ...]]  # chain -> its "-A chain ..." lines, in order

    def our_chains(self) -> list[str]:
        return [chain for chain in self.chains if chain.startswith(f"{PREFIX}-")]


def parse_saved_filter_table(text: str) -> SavedTable:
    """The filter table out of `iptables-save -t filter` output."""
    chains: list[str] = []
    rules: dict[str, list[str]] = {}
    in_filter = False
    for line in text.splitlines():
        if line.startswith("*"):
            in_filter = line == "*filter"
        elif not in_filter:
            continue
        elif line.startswith(":"):
            chains.append(line[1:].split(" ", 1)[0])
        elif line.startswith("-A "):
            rules.setdefault(line.split(" ", 2)[1], []).append(line)
    return SavedTable(
        chains=tuple(chains), rules={chain: tuple(lines) for chain, lines in rules.items()}
    )


def cleanup_restore_text(saved: SavedTable) -> str | None:
    """restore input that removes every hook and chain of ours, or None when there are none."""
    ours = saved.our_chains()
    unhooks = [
        f"-D {chain} {rule.removeprefix(f'-A {chain} ')}"
        for chain in saved.chains
        if not chain.startswith(f"{PREFIX}-")
        for rule in saved.rules.get(chain, ())
        if (_jump_target(rule) or "").startswith(f"{PREFIX}-")
    ]
    if not ours and not unhooks:
        return None
    lines = ["*filter", *(f":{chain} - [0:0]" for chain in ours), *unhooks]
    lines.extend(f"-X {chain}" for chain in ours)
    lines.append("COMMIT")
    return "".join(f"{line}\n" for line in lines)


def is_our_set(name: str) -> bool:
    return name.startswith(f"{PREFIX}-")
