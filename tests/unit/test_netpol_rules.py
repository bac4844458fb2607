"""The enforcer's pure core: NetworkPolicy semantics of the generated ruleset.

Most tests evaluate packets against the generated iptables-restore and ipset
restore text with a small walker that implements exactly the iptables
features the generator uses (tests/unit/test_netpol_kernel.py checks the same
behaviour in a real kernel).
"""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_address, ip_network
from typing import Any

import pytest
from sandpod_netpol.rules import (
    FORWARD_CHAIN,
    INPUT_CHAIN,
    Ruleset,
    build_ruleset,
    cleanup_restore_text,
    hook_commands,
    ip_block_entries,
    parse_saved_filter_table,
)
from sandpod_netpol.selection import CniAttachment, IpBlockPeer, NodeInfo, selector_matches

NODE = NodeInfo(
    name="node-1",
    pod_cidr=IPv4Network("10.244.0.0/24"),
    bridge="cni0",
    addresses=frozenset(
        {IPv4Address("10.244.0.1"), IPv4Address("192.0.2.2"), IPv4Address("127.0.0.1")}
    ),
)
NODE_IP = "192.0.2.2"
GATEWAY = "10.244.0.1"
EXTERNAL = "198.51.100.7"


# --- objects -------------------------------------------------------------------------------


def pod(
    name: str,
    ip: str | None,
    *,
    namespace: str = "default",
    labels: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    node: str = "node-1",
    phase: str = "Running",
    host_network: bool = False,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status.update(podIP=ip, podIPs=[{"ip": ip}])
    return {
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"uid-{namespace}-{name}",
            "labels": labels or {},
            "creationTimestamp": created,
        },
        "spec": {
            "nodeName": node,
            "hostNetwork": host_network,
            "containers": [{"name": "main", "ports": ports or []}],
        },
        "status": status,
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


def policy(
    name: str,
    *,
    namespace: str = "default",
    selector: dict[str, Any] | None = None,
    ingress: list[dict[str, Any]] | None = None,
    egress: list[dict[str, Any]] | None = None,
    types: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"podSelector": selector if selector is not None else {}}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    if types is not None:
        spec["policyTypes"] = types
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec}


def deny_all(direction: str, namespace: str = "default") -> dict[str, Any]:
    return policy(f"deny-{direction.lower()}", namespace=namespace, types=[direction])


# --- a walker over the generated text ------------------------------------------------------


@dataclass(frozen=True)
class Packet:
    src: str
    dst: str
    proto: str = "tcp"
    dport: int | None = 80
    established: bool = False
    dnat: bool = False


class Firewall:
    """Our IPv4 chains as the kernel runs them, read back from the restore text."""

    def __init__(self, ruleset: Ruleset) -> None:
        self.chains: dict[str, list[list[str]]] = {}
        for line in ruleset.iptables_restore_text(4).splitlines():
            if line.startswith(":"):
                self.chains[line[1:].split()[0]] = []
            elif line.startswith("-A "):
                tokens = shlex.split(line)
                self.chains[tokens[1]].append(tokens[2:])
        self.sets: dict[str, tuple[str, list[tuple[IPv4Network, bool]]]] = {}
        for line in ruleset.ipset_restore_text().splitlines():
            tokens = line.split()
            if tokens[0] == "create":
                self.sets[tokens[1]] = (tokens[2], [])
            else:
                assert tokens[0] == "add" and tokens[-1] == "-exist"
                self.sets[tokens[1]][1].append((IPv4Network(tokens[2]), "nomatch" in tokens))

    def verdict(self, packet: Packet, hook: str = "FORWARD") -> str:
        chain = FORWARD_CHAIN if hook == "FORWARD" else INPUT_CHAIN
        return self._run(chain, packet) or "ALLOW"

    def allows(self, packet: Packet, hook: str = "FORWARD") -> bool:
        return self.verdict(packet, hook) == "ALLOW"

    def _run(self, chain: str, packet: Packet) -> str | None:
        for tokens in self.chains[chain]:
            matched, action, target = self._match(tokens, packet)
            if not matched:
                continue
            if target == "RETURN":
                return None
            if target in ("DROP", "REJECT"):
                return target
            result = self._run(target, packet)
            if action == "-g" or result is not None:
                return result  # a goto's RETURN goes back to our caller
        return None

    def _in_set(self, name: str, address: str) -> bool:
        kind, entries = self.sets[name]
        ip = ip_address(address)
        if kind == "hash:ip":
            return any(ip in network for network, _ in entries)
        containing = [(net, nomatch) for net, nomatch in entries if ip in net]
        if not containing:
            return False
        _, nomatch = max(containing, key=lambda entry: entry[0].prefixlen)
        return not nomatch

    def _match(self, tokens: list[str], packet: Packet) -> tuple[bool, str, str]:
        matched = True
        action = target = ""
        negate = False
        index = 0
        while index < len(tokens):
            token = tokens[index]
            argument = tokens[index + 1] if index + 1 < len(tokens) else ""
            index += 2
            if token == "!":
                negate, index = True, index - 1
                continue
            if token == "-s":
                matched &= ip_address(packet.src) in ip_network(argument)
            elif token == "-d":
                matched &= ip_address(packet.dst) in ip_network(argument)
            elif token == "-p":
                matched &= packet.proto == argument
            elif token == "-m":
                pass  # loading a match module
            elif token == "--dport":
                low, _, high = argument.partition(":")
                matched &= packet.dport is not None and (
                    int(low) <= packet.dport <= int(high or low)
                )
            elif token == "--match-set":
                address = packet.src if tokens[index] == "src" else packet.dst
                index += 1
                matched &= self._in_set(argument, address) != negate
                negate = False
            elif token == "--ctstate":
                states = {"RELATED,ESTABLISHED": packet.established, "DNAT": packet.dnat}
                matched &= states[argument] != negate
                negate = False
            elif token in ("--comment", "--reject-with"):
                pass
            elif token in ("-j", "-g"):
                action, target = token, argument
            else:
                raise AssertionError(f"walker does not know {token!r} in {tokens}")
        return matched, action, target


def firewall(
    policies: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    namespaces: list[dict[str, Any]] | None = None,
    attachments: dict[tuple[str, str], CniAttachment] | None = None,
) -> Firewall:
    ruleset = build_ruleset(
        policies=policies,
        pods=pods,
        namespaces=namespaces or [namespace("default")],
        node=NODE,
        attachments=attachments,
    )
    return Firewall(ruleset)


A, B, C = "10.244.0.10", "10.244.0.11", "10.244.0.12"
WEB_PORTS = [
    {"name": "http", "containerPort": 8080},
    {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
]


def three_pods(**labels_b: str) -> list[dict[str, Any]]:
    return [
        pod("a", A, labels={"app": "client"}),
        pod("b", B, labels={"app": "web", **labels_b}, ports=WEB_PORTS),
        pod("c", C, labels={"app": "other"}),
    ]


# --- no policies, isolation, defaulting ----------------------------------------------------


def test_without_policies_everything_flows() -> None:
    fw = firewall([], three_pods())
    assert fw.allows(Packet(A, B))
    assert fw.allows(Packet(B, A, "udp", 53))
    assert fw.allows(Packet(A, NODE_IP, dport=6443), hook="INPUT")
    assert fw.allows(Packet(EXTERNAL, B))
    assert fw.allows(Packet(A, EXTERNAL, dport=443))


def test_deny_all_ingress_blocks_new_connections_but_not_replies_or_egress() -> None:
    fw = firewall([deny_all("Ingress")], three_pods())
    assert fw.verdict(Packet(A, B)) == "REJECT"
    assert fw.verdict(Packet(EXTERNAL, B, "udp", 53)) == "REJECT"
    assert fw.allows(Packet(A, B, established=True))
    assert fw.allows(Packet(B, EXTERNAL, dport=443))
    assert fw.allows(Packet(B, NODE_IP, dport=6443), hook="INPUT")


def test_deny_all_egress_cuts_pods_off_from_everything_including_the_node() -> None:
    fw = firewall([deny_all("Egress")], three_pods())
    assert not fw.allows(Packet(A, B))
    assert not fw.allows(Packet(A, EXTERNAL, dport=443))
    # The API server and CoreDNS live on the node: the INPUT path.
    assert not fw.allows(Packet(A, NODE_IP, dport=6443), hook="INPUT")
    assert not fw.allows(Packet(A, NODE_IP, "udp", 53), hook="INPUT")
    assert not fw.allows(Packet(A, GATEWAY, "udp", 53), hook="INPUT")
    assert fw.allows(Packet(A, B, established=True))  # replies to connections made earlier


def test_service_traffic_is_policed_on_its_real_endpoint() -> None:
    fw = firewall([deny_all("Egress")], three_pods())
    # kube-proxy has rewritten the service IP to the endpoint before filtering.
    assert fw.verdict(Packet(A, NODE_IP, dport=6443, dnat=True), hook="INPUT") == "REJECT"
    assert fw.verdict(Packet(A, B, dport=8080, dnat=True)) == "REJECT"


def test_node_to_pod_traffic_never_meets_pod_rules() -> None:
    fw = firewall([deny_all("Ingress"), deny_all("Egress")], three_pods())
    # Node-originated packets leave through OUTPUT; its replies to pods are replies.
    assert fw.allows(Packet(NODE_IP, A, established=True))
    assert fw.allows(Packet(NODE_IP, A, dport=8080), hook="INPUT")  # not from the pod CIDR


def test_unselected_pods_stay_unrestricted() -> None:
    isolate_web = policy(
        "web", selector={"matchLabels": {"app": "web"}}, types=["Ingress", "Egress"]
    )
    fw = firewall([isolate_web], three_pods())
    assert not fw.allows(Packet(A, B))
    assert not fw.allows(Packet(B, A))
    assert fw.allows(Packet(A, C))
    assert fw.allows(Packet(C, A, "udp", 53))
    assert fw.allows(Packet(C, NODE_IP, dport=6443), hook="INPUT")


def test_policy_types_default_to_ingress_plus_egress_when_egress_rules_exist() -> None:
    ingress_only = policy("i", ingress=[])
    fw = firewall([ingress_only], three_pods())
    assert not fw.allows(Packet(A, B))
    assert fw.allows(Packet(A, EXTERNAL))  # egress not governed

    with_egress_rules = policy("e", egress=[{"ports": [{"port": 53, "protocol": "UDP"}]}])
    fw = firewall([with_egress_rules], three_pods())
    assert not fw.allows(Packet(A, B))  # Ingress is always implied
    assert fw.allows(Packet(A, NODE_IP, "udp", 53), hook="INPUT")
    assert not fw.allows(Packet(A, EXTERNAL, dport=443))


def test_egress_only_policy_leaves_ingress_open() -> None:
    fw = firewall([deny_all("Egress")], three_pods())
    assert fw.allows(Packet(EXTERNAL, A, dport=8080))


def test_policies_only_select_pods_in_their_own_namespace() -> None:
    pods = [*three_pods(), pod("x", "10.244.0.20", namespace="other")]
    fw = firewall(
        [deny_all("Ingress", namespace="other")], pods, [namespace("default"), namespace("other")]
    )
    assert not fw.allows(Packet(A, "10.244.0.20"))
    assert fw.allows(Packet("10.244.0.20", A))


# --- selectors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ({}, {}, True),
        ({}, {"a": "1"}, True),
        (None, {"a": "1"}, False),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
            {"a": "2"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
            {"a": "1"},
            False,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
        (
            {
                "matchLabels": {"tier": "db"},
                "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}],
            },
            {"tier": "db", "env": "dev"},
            False,
        ),
    ],
)
def test_label_selector(
    selector: dict[str, Any] | None, labels: dict[str, str], expected: bool
) -> None:
    assert selector_matches(selector, labels) is expected


def test_policy_pod_selector_uses_match_expressions() -> None:
    isolate = policy(
        "p",
        selector={"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["client"]}]},
        types=["Ingress"],
    )
    fw = firewall([isolate], three_pods())
    assert fw.allows(Packet(C, A))
    assert not fw.allows(Packet(A, B))
    assert not fw.allows(Packet(A, C))


# --- peers ---------------------------------------------------------------------------------


def allow_to_web(peers: list[dict[str, Any]]) -> dict[str, Any]:
    return policy("allow", selector={"matchLabels": {"app": "web"}}, ingress=[{"from": peers}])


def test_pod_selector_peer_is_limited_to_the_policy_namespace() -> None:
    pods = [
        *three_pods(),
        pod("client-elsewhere", "10.244.0.30", namespace="other", labels={"app": "client"}),
    ]
    fw = firewall(
        [allow_to_web([{"podSelector": {"matchLabels": {"app": "client"}}}])],
        pods,
        [namespace("default"), namespace("other")],
    )
    assert fw.allows(Packet(A, B))
    assert not fw.allows(Packet(C, B))
    assert not fw.allows(Packet("10.244.0.30", B))


def test_namespace_selector_peer_takes_every_pod_of_matching_namespaces() -> None:
    pods = [
        *three_pods(),
        pod("m1", "10.244.0.40", namespace="monitoring"),
        pod("s1", "10.244.0.41", namespace="staging"),
    ]
    namespaces = [namespace("default"), namespace("monitoring", team="ops"), namespace("staging")]
    fw = firewall(
        [allow_to_web([{"namespaceSelector": {"matchLabels": {"team": "ops"}}}])], pods, namespaces
    )
    assert fw.allows(Packet("10.244.0.40", B))
    assert not fw.allows(Packet("10.244.0.41", B))
    assert not fw.allows(Packet(A, B))  # own namespace does not match the selector


def test_namespace_and_pod_selector_in_one_peer_must_both_match() -> None:
    pods = [
        *three_pods(),
        pod("agent", "10.244.0.40", namespace="monitoring", labels={"role": "agent"}),
        pod("other", "10.244.0.41", namespace="monitoring"),
        pod("agent2", "10.244.0.42", namespace="staging", labels={"role": "agent"}),
    ]
    namespaces = [namespace("default"), namespace("monitoring", team="ops"), namespace("staging")]
    peer = {
        "namespaceSelector": {"matchLabels": {"team": "ops"}},
        "podSelector": {"matchLabels": {"role": "agent"}},
    }
    fw = firewall([allow_to_web([peer])], pods, namespaces)
    assert fw.allows(Packet("10.244.0.40", B))
    assert not fw.allows(Packet("10.244.0.41", B))
    assert not fw.allows(Packet("10.244.0.42", B))


def test_empty_namespace_selector_means_all_namespaces_even_unseen_ones() -> None:
    pods = [*three_pods(), pod("x", "10.244.0.50", namespace="not-listed-yet")]
    fw = firewall([allow_to_web([{"namespaceSelector": {}}])], pods)
    assert fw.allows(Packet("10.244.0.50", B))
    assert fw.allows(Packet(A, B))
    assert not fw.allows(Packet(EXTERNAL, B))


def test_namespace_selector_can_use_the_automatic_name_label() -> None:
    pods = [*three_pods(), pod("x", "10.244.0.50", namespace="tools")]
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}}}
    fw = firewall([allow_to_web([peer])], pods)  # namespace object not seen yet
    assert fw.allows(Packet("10.244.0.50", B))


def test_empty_from_list_allows_every_source() -> None:
    fw = firewall(
        [
            policy(
                "p", selector={"matchLabels": {"app": "web"}}, ingress=[{"ports": [{"port": 8080}]}]
            )
        ],
        three_pods(),
    )
    assert fw.allows(Packet(EXTERNAL, B, dport=8080))
    assert fw.allows(Packet(A, B, dport=8080))
    assert not fw.allows(Packet(A, B, dport=8081))


def test_an_empty_rule_allows_everything() -> None:
    open_web = policy(
        "open",
        selector={"matchLabels": {"app": "web"}},
        ingress=[{}],
        egress=[{}],
        types=["Ingress", "Egress"],
    )
    fw = firewall([deny_all("Ingress"), open_web], three_pods())
    assert fw.allows(Packet(EXTERNAL, B, "udp", 9))
    assert fw.allows(Packet(B, NODE_IP, dport=6443), hook="INPUT")
    assert not fw.allows(Packet(B, A))  # a is under deny-all ingress


def test_peer_selector_matching_no_pods_allows_nothing() -> None:
    fw = firewall(
        [allow_to_web([{"podSelector": {"matchLabels": {"app": "nobody"}}}])], three_pods()
    )
    assert not fw.allows(Packet(A, B))
    assert not fw.allows(Packet(EXTERNAL, B))


def test_ip_block_with_except() -> None:
    peer = {"ipBlock": {"cidr": "198.51.100.0/24", "except": ["198.51.100.128/25"]}}
    fw = firewall([allow_to_web([peer])], three_pods())
    assert fw.allows(Packet("198.51.100.7", B))
    assert not fw.allows(Packet("198.51.100.200", B))
    assert not fw.allows(Packet("203.0.113.1", B))


def test_ip_block_everything_except_private_ranges_for_egress() -> None:
    internet = policy(
        "internet",
        egress=[
            {
                "to": [
                    {
                        "ipBlock": {
                            "cidr": "0.0.0.0/0",
                            "except": ["10.0.0.0/8", "192.168.0.0/16", "192.0.2.0/24"],
                        }
                    }
                ]
            }
        ],
        types=["Egress"],
    )
    fw = firewall([internet], three_pods())
    assert fw.allows(Packet(A, "203.0.113.9", dport=443))
    assert fw.allows(Packet(A, "8.8.8.8", "udp", 53))
    assert not fw.allows(Packet(A, B))
    assert not fw.allows(Packet(A, NODE_IP, dport=6443), hook="INPUT")


def test_two_ip_blocks_in_one_rule_are_a_union_despite_excepts() -> None:
    peers: list[dict[str, Any]] = [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}},
        {"ipBlock": {"cidr": "10.1.0.0/16"}},
    ]
    fw = firewall([allow_to_web(peers)], three_pods())
    assert fw.allows(Packet("10.1.2.3", B))
    assert fw.allows(Packet("10.2.2.3", B))


@pytest.mark.parametrize(
    ("cidr", "excepts", "expected"),
    [
        ("10.0.0.0/8", [], ["10.0.0.0/8"]),
        ("10.0.0.5/8", [], ["10.0.0.0/8"]),
        ("10.0.0.0/8", ["10.1.0.0/16"], ["10.0.0.0/8", "10.1.0.0/16 nomatch"]),
        ("0.0.0.0/0", [], ["0.0.0.0/1", "128.0.0.0/1"]),
        ("0.0.0.0/0", ["10.0.0.0/8"], ["0.0.0.0/1", "128.0.0.0/1", "10.0.0.0/8 nomatch"]),
        ("0.0.0.0/0", ["0.0.0.0/1"], ["128.0.0.0/1"]),
        ("10.0.0.0/24", ["10.0.0.0/24"], []),
        ("10.0.0.0/24", ["192.168.0.0/16"], ["10.0.0.0/24"]),
        ("fd00::/8", [], []),
        ("10.0.0.0/8", ["fd00::/64"], ["10.0.0.0/8"]),
    ],
)
def test_ip_block_entries(cidr: str, excepts: list[str], expected: list[str]) -> None:
    assert sorted(ip_block_entries(IpBlockPeer(cidr, tuple(excepts)))) == sorted(expected)


# --- ports ---------------------------------------------------------------------------------


def allow_ports(ports: list[dict[str, Any]], direction: str = "ingress") -> dict[str, Any]:
    if direction == "ingress":
        return policy("ports", selector={"matchLabels": {"app": "web"}}, ingress=[{"ports": ports}])
    return policy(
        "ports",
        selector={"matchLabels": {"app": "client"}},
        egress=[{"ports": ports}],
        types=["Egress"],
    )


def test_port_protocol_defaults_to_tcp() -> None:
    fw = firewall([allow_ports([{"port": 8080}])], three_pods())
    assert fw.allows(Packet(A, B, "tcp", 8080))
    assert not fw.allows(Packet(A, B, "udp", 8080))


def test_udp_and_sctp_ports() -> None:
    fw = firewall(
        [allow_ports([{"port": 53, "protocol": "UDP"}, {"port": 9000, "protocol": "SCTP"}])],
        three_pods(),
    )
    assert fw.allows(Packet(A, B, "udp", 53))
    assert not fw.allows(Packet(A, B, "tcp", 53))
    assert fw.allows(Packet(A, B, "sctp", 9000))
    assert not fw.allows(Packet(A, B, "sctp", 9001))


def test_protocol_without_port_means_every_port_of_it() -> None:
    fw = firewall([allow_ports([{"protocol": "UDP"}])], three_pods())
    assert fw.allows(Packet(A, B, "udp", 1))
    assert fw.allows(Packet(A, B, "udp", 65535))
    assert not fw.allows(Packet(A, B, "tcp", 80))
    assert not fw.allows(Packet(A, B, "icmp", None))


def test_no_ports_means_every_protocol() -> None:
    fw = firewall([allow_to_web([{"podSelector": {}}])], three_pods())
    assert fw.allows(Packet(A, B, "icmp", None))
    assert fw.allows(Packet(A, B, "udp", 7))


def test_end_port_range() -> None:
    fw = firewall([allow_ports([{"port": 32000, "endPort": 32768}])], three_pods())
    assert fw.allows(Packet(A, B, dport=32000))
    assert fw.allows(Packet(A, B, dport=32500))
    assert fw.allows(Packet(A, B, dport=32768))
    assert not fw.allows(Packet(A, B, dport=31999))
    assert not fw.allows(Packet(A, B, dport=32769))


def second_web_pod() -> dict[str, Any]:
    """b2 (10.244.0.13): another app=web pod, whose port named http is 9090 (b's is 8080)."""
    return pod(
        "b2", "10.244.0.13", labels={"app": "web"}, ports=[{"name": "http", "containerPort": 9090}]
    )


def test_named_ingress_port_resolves_on_the_target_pod() -> None:
    pods = [*three_pods(), second_web_pod()]
    fw = firewall([allow_ports([{"port": "http"}, {"port": "dns", "protocol": "UDP"}])], pods)
    assert fw.allows(Packet(A, B, dport=8080))
    assert not fw.allows(Packet(A, B, dport=9090))
    assert fw.allows(Packet(A, "10.244.0.13", dport=9090))
    assert not fw.allows(Packet(A, "10.244.0.13", dport=8080))
    assert fw.allows(Packet(A, B, "udp", 5353))
    assert not fw.allows(Packet(A, "10.244.0.13", "udp", 5353))  # b2 has no port named dns


def test_named_port_must_match_protocol_too() -> None:
    fw = firewall([allow_ports([{"port": "dns", "protocol": "TCP"}])], three_pods())
    assert not fw.allows(Packet(A, B, "tcp", 5353))
    assert not fw.allows(Packet(A, B, "udp", 5353))


def test_unresolvable_named_port_allows_nothing_rather_than_everything() -> None:
    fw = firewall([allow_ports([{"port": "grpc"}])], three_pods())
    assert not fw.allows(Packet(A, B, dport=8080))
    assert not fw.allows(Packet(A, B, dport=50051))


def test_named_egress_port_resolves_on_each_destination_pod() -> None:
    pods = [*three_pods(), second_web_pod()]
    fw = firewall([allow_ports([{"port": "http"}], direction="egress")], pods)
    assert fw.allows(Packet(A, B, dport=8080))
    assert fw.allows(Packet(A, "10.244.0.13", dport=9090))
    assert not fw.allows(Packet(A, B, dport=9090))
    assert not fw.allows(Packet(A, C, dport=8080))  # c has no port named http
    assert not fw.allows(Packet(A, EXTERNAL, dport=8080))  # nothing outside has names


def test_named_egress_port_respects_peers() -> None:
    pods = [
        *three_pods(),
        pod("w2", "10.244.0.13", labels={"app": "web", "tier": "x"}, ports=WEB_PORTS),
    ]
    egress = policy(
        "p",
        selector={"matchLabels": {"app": "client"}},
        egress=[
            {"to": [{"podSelector": {"matchLabels": {"tier": "x"}}}], "ports": [{"port": "http"}]}
        ],
        types=["Egress"],
    )
    fw = firewall([egress], pods)
    assert fw.allows(Packet(A, "10.244.0.13", dport=8080))
    assert not fw.allows(Packet(A, B, dport=8080))


def test_ports_and_peers_of_a_rule_combine_and_rules_are_alternatives() -> None:
    rules = [
        {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}], "ports": [{"port": 8080}]},
        {"from": [{"podSelector": {"matchLabels": {"app": "other"}}}], "ports": [{"port": 9090}]},
    ]
    fw = firewall(
        [policy("p", selector={"matchLabels": {"app": "web"}}, ingress=rules)], three_pods()
    )
    assert fw.allows(Packet(A, B, dport=8080))
    assert not fw.allows(Packet(A, B, dport=9090))
    assert fw.allows(Packet(C, B, dport=9090))
    assert not fw.allows(Packet(C, B, dport=8080))


# --- union of policies ---------------------------------------------------------------------


def test_policies_selecting_the_same_pod_add_up() -> None:
    from_client = allow_to_web([{"podSelector": {"matchLabels": {"app": "client"}}}])
    from_other = policy(
        "allow-other",
        selector={"matchLabels": {"app": "web"}},
        ingress=[
            {
                "from": [{"podSelector": {"matchLabels": {"app": "other"}}}],
                "ports": [{"port": 9090}],
            }
        ],
    )
    fw = firewall([deny_all("Ingress"), from_client, from_other], three_pods())
    assert fw.allows(Packet(A, B, dport=1234))
    assert fw.allows(Packet(C, B, dport=9090))
    assert not fw.allows(Packet(C, B, dport=1234))
    assert not fw.allows(Packet(B, A))  # a is only under deny-all


def test_egress_and_ingress_both_have_to_allow_pod_to_pod_traffic() -> None:
    client_egress = policy(
        "client-out",
        selector={"matchLabels": {"app": "client"}},
        egress=[{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}]}],
        types=["Egress"],
    )
    web_ingress = allow_to_web([{"podSelector": {"matchLabels": {"app": "other"}}}])
    fw = firewall([client_egress, web_ingress], three_pods())
    assert not fw.allows(Packet(A, B))  # egress allows, ingress does not
    assert fw.allows(Packet(C, B))
    assert not fw.allows(Packet(A, C))  # ingress open, egress does not allow


# --- egress to the node --------------------------------------------------------------------


def test_egress_to_node_dns_by_ip_block_does_not_open_the_api_server() -> None:
    dns_only = policy(
        "dns",
        egress=[
            {
                "to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}],
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
            }
        ],
        types=["Egress"],
    )
    fw = firewall([dns_only], three_pods())
    assert fw.allows(Packet(A, NODE_IP, "udp", 53), hook="INPUT")
    assert fw.allows(Packet(A, NODE_IP, "tcp", 53), hook="INPUT")
    assert not fw.allows(Packet(A, NODE_IP, "tcp", 6443), hook="INPUT")
    assert not fw.allows(Packet(A, GATEWAY, "udp", 53), hook="INPUT")


def test_pod_selectors_never_match_the_node_through_host_network_pods() -> None:
    pods = [
        *three_pods(),
        pod(
            "apiserver", NODE_IP, namespace="kube-system", host_network=True, labels={"app": "web"}
        ),
    ]
    everything_in_cluster = policy(
        "p", egress=[{"to": [{"namespaceSelector": {}}]}], types=["Egress"]
    )
    fw = firewall([everything_in_cluster], pods)
    assert fw.allows(Packet(A, B))
    assert not fw.allows(Packet(A, NODE_IP, dport=6443), hook="INPUT")


# --- which pods, which addresses -----------------------------------------------------------


def test_host_network_pods_are_not_subject() -> None:
    pods = [*three_pods(), pod("hostnet", NODE_IP, host_network=True)]
    ruleset = build_ruleset(
        policies=[deny_all("Ingress"), deny_all("Egress")], pods=pods, namespaces=[], node=NODE
    )
    assert NODE_IP not in ruleset.iptables_restore_text(4).replace(f"{NODE_IP}/32 -m comment", "")
    assert all(
        f"{NODE_IP}/32" not in rule for rules in ruleset.ipv4_chains.values() for rule in rules
    )


def test_pods_on_other_nodes_are_peers_but_not_policed_here() -> None:
    remote = "10.244.1.5"
    pods = [*three_pods(), pod("remote", remote, node="node-2", labels={"app": "client"})]
    policies = [
        deny_all("Egress"),
        allow_to_web([{"podSelector": {"matchLabels": {"app": "client"}}}]),
    ]
    ruleset = build_ruleset(policies=policies, pods=pods, namespaces=[], node=NODE)
    fw = Firewall(ruleset)
    assert fw.allows(Packet(remote, B))
    assert f"-s {remote}/32" not in "".join(
        rule for rules in ruleset.ipv4_chains.values() for rule in rules
    )


def test_finished_pods_give_up_their_address() -> None:
    pods = [*three_pods(), pod("done", "10.244.0.60", labels={"app": "client"}, phase="Succeeded")]
    fw = firewall([allow_to_web([{"podSelector": {"matchLabels": {"app": "client"}}}])], pods)
    assert not fw.allows(Packet("10.244.0.60", B))
    assert not fw.allows(Packet("10.244.0.60", C))  # unknown pod-CIDR address


def test_unknown_pod_cidr_addresses_are_dropped_both_ways() -> None:
    fw = firewall([], three_pods())
    stranger = "10.244.0.99"
    assert fw.verdict(Packet(stranger, A)) == "DROP"
    assert fw.verdict(Packet(A, stranger)) == "DROP"
    assert fw.verdict(Packet(EXTERNAL, stranger)) == "DROP"
    assert fw.verdict(Packet(stranger, NODE_IP, "udp", 53), hook="INPUT") == "DROP"
    assert fw.allows(Packet(GATEWAY, A, established=False))  # the node's own bridge address


def test_cni_attachment_programs_a_pod_before_its_status_has_an_ip() -> None:
    pods = [*three_pods(), pod("new", None, labels={"app": "sandbox"})]
    attachments = {
        ("default", "new"): CniAttachment("c1", IPv4Address("10.244.0.70"), "uid-default-new")
    }
    sandbox_deny = policy("s", selector={"matchLabels": {"app": "sandbox"}}, types=["Egress"])
    fw = firewall([sandbox_deny], pods, attachments=attachments)
    assert fw.verdict(Packet("10.244.0.70", A)) == "REJECT"
    assert fw.verdict(Packet("10.244.0.70", NODE_IP, "udp", 53), hook="INPUT") == "REJECT"
    assert fw.allows(Packet(A, "10.244.0.70", "udp", 53))


def test_cni_attachment_wins_over_a_stale_status_ip() -> None:
    pods = [
        pod("old", "10.244.0.80", labels={"app": "open"}),
        pod("new", None, labels={"app": "sandbox"}),
    ]
    attachments = {("default", "new"): CniAttachment("c2", IPv4Address("10.244.0.80"), None)}
    sandbox_deny = policy("s", selector={"matchLabels": {"app": "sandbox"}}, types=["Egress"])
    fw = firewall([sandbox_deny], pods, attachments=attachments)
    assert not fw.allows(Packet("10.244.0.80", EXTERNAL))


def test_ip_reused_by_a_newer_pod_goes_to_the_newer_pod() -> None:
    pods = [
        pod("old", "10.244.0.80", labels={"app": "open"}, created="2026-01-01T00:00:00Z"),
        pod("new", "10.244.0.80", labels={"app": "sandbox"}, created="2026-01-01T00:05:00Z"),
    ]
    sandbox_deny = policy("s", selector={"matchLabels": {"app": "sandbox"}}, types=["Egress"])
    fw = firewall([sandbox_deny], pods)
    assert not fw.allows(Packet("10.244.0.80", EXTERNAL))


def test_torn_down_network_forgets_the_address() -> None:
    pods = [*three_pods(), pod("gone", "10.244.0.90")]
    attachments = {("default", "gone"): CniAttachment("c3", None, None)}
    fw = firewall([], pods, attachments=attachments)
    assert fw.verdict(Packet("10.244.0.90", A)) == "DROP"


def test_attachment_of_an_earlier_pod_with_the_same_name_is_ignored() -> None:
    pods = [pod("web-0", "10.244.0.91")]
    attachments = {("default", "web-0"): CniAttachment("c4", IPv4Address("10.244.0.95"), "old-uid")}
    fw = firewall([], pods, attachments=attachments)
    assert fw.allows(Packet("10.244.0.91", EXTERNAL))
    assert fw.verdict(Packet("10.244.0.95", EXTERNAL)) == "DROP"


# --- the text itself -----------------------------------------------------------------------


def sample_ruleset() -> Ruleset:
    pods = [*three_pods(), pod("d", "10.244.0.14", labels={"app": "web"}, ports=WEB_PORTS)]
    policies = [
        deny_all("Egress"),
        allow_to_web(
            [
                {"podSelector": {"matchLabels": {"app": "client"}}},
                {"ipBlock": {"cidr": "0.0.0.0/0"}},
            ]
        ),
    ]
    return build_ruleset(policies=policies, pods=pods, namespaces=[namespace("default")], node=NODE)


def test_ruleset_is_deterministic_and_pods_with_equal_rules_share_a_chain() -> None:
    first, second = sample_ruleset(), sample_ruleset()
    assert first == second
    assert first.iptables_restore_text(4) == second.iptables_restore_text(4)
    ingress_chains = [name for name in first.ipv4_chains if name.startswith("SANDPOD-NP-I-")]
    assert len(ingress_chains) == 1  # b and d have identical rules
    assert len(first.ipv4_chains["SANDPOD-NP-INGRESS"]) == 2


def test_every_chain_and_set_referenced_is_defined_and_names_fit_the_kernel() -> None:
    ruleset = sample_ruleset()
    text = ruleset.iptables_restore_text(4)
    declared = {line[1:].split()[0] for line in text.splitlines() if line.startswith(":")}
    sets = {ipset.name for ipset in ruleset.ipsets}
    for line in text.splitlines():
        tokens = shlex.split(line)
        for flag, value in itertools.pairwise(tokens):
            if flag in ("-j", "-g") and value.startswith("SANDPOD-NP"):
                assert value in declared
            if flag == "--match-set":
                assert value in sets
    assert all(len(name) <= 28 for name in declared)
    assert all(len(name) <= 31 for name in sets)
    assert text.startswith("*filter\n") and text.endswith("COMMIT\n")


def test_ipset_restore_text_creates_then_fills_each_set() -> None:
    ruleset = sample_ruleset()
    lines = ruleset.ipset_restore_text().splitlines()
    created: set[str] = set()
    for line in lines:
        verb, name = line.split()[:2]
        if verb == "create":
            assert line.endswith("family inet -exist")
            created.add(name)
        else:
            assert verb == "add" and name in created


def test_ipv6_from_the_bridge_is_dropped() -> None:
    text = sample_ruleset().iptables_restore_text(6)
    assert "-A SANDPOD-NP-FORWARD -i cni0 -j DROP" in text
    assert "-A SANDPOD-NP-FORWARD -o cni0 -j DROP" in text
    assert "-A SANDPOD-NP-INPUT -i cni0 -j DROP" in text


def test_restore_text_deletes_stale_chains_after_flushing_them() -> None:
    text = sample_ruleset().iptables_restore_text(
        4, stale_chains=["SANDPOD-NP-I-000000000000000", "SANDPOD-NP-FORWARD"]
    )
    lines = text.splitlines()
    assert ":SANDPOD-NP-I-000000000000000 - [0:0]" in lines
    assert lines[-2] == "-X SANDPOD-NP-I-000000000000000"
    assert "-X SANDPOD-NP-FORWARD" not in lines  # still wanted


# --- hooks and cleanup ---------------------------------------------------------------------


HOOK = "-A FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD"


def test_hook_is_inserted_when_missing() -> None:
    assert hook_commands("FORWARD", []) == [
        "-I FORWARD 1 -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD"
    ]


def test_hook_in_first_place_is_left_alone() -> None:
    assert hook_commands("FORWARD", [HOOK, "-A FORWARD -j KUBE-FORWARD"]) == []


def test_hook_pushed_down_by_someone_else_moves_back_to_the_top() -> None:
    saved = ["-A FORWARD -m comment --comment kube -j KUBE-FORWARD", HOOK]
    assert hook_commands("FORWARD", saved) == [
        "-D FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD",
        "-I FORWARD 1 -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD",
    ]


def test_duplicate_hooks_are_collapsed() -> None:
    saved = [HOOK, "-A FORWARD -j SANDPOD-NP-FORWARD"]
    assert hook_commands("FORWARD", saved) == [
        "-D FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD",
        "-D FORWARD -j SANDPOD-NP-FORWARD",
        "-I FORWARD 1 -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD",
    ]


SAVED = """# Generated by iptables-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -j SANDPOD-NP-NOT-FILTER
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-FORWARD - [0:0]
:SANDPOD-NP-FORWARD - [0:0]
:SANDPOD-NP-INPUT - [0:0]
:SANDPOD-NP-E-0123456789abcde - [0:0]
-A INPUT -m comment --comment sandpod-netpol -j SANDPOD-NP-INPUT
-A FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A SANDPOD-NP-FORWARD -s 10.244.0.5/32 -g SANDPOD-NP-E-0123456789abcde
-A SANDPOD-NP-E-0123456789abcde -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""


def test_parse_saved_filter_table() -> None:
    saved = parse_saved_filter_table(SAVED)
    assert saved.our_chains() == [
        "SANDPOD-NP-FORWARD",
        "SANDPOD-NP-INPUT",
        "SANDPOD-NP-E-0123456789abcde",
    ]
    assert saved.rules["FORWARD"][1].endswith("-j KUBE-FORWARD")
    assert "PREROUTING" not in saved.rules


def test_cleanup_unhooks_then_deletes_only_our_chains() -> None:
    text = cleanup_restore_text(parse_saved_filter_table(SAVED))
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == "*filter" and lines[-1] == "COMMIT"
    assert "-D INPUT -m comment --comment sandpod-netpol -j SANDPOD-NP-INPUT" in lines
    assert "-D FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD" in lines
    assert [line for line in lines if line.startswith("-X")] == [
        "-X SANDPOD-NP-FORWARD",
        "-X SANDPOD-NP-INPUT",
        "-X SANDPOD-NP-E-0123456789abcde",
    ]
    assert "KUBE-FORWARD" not in text.replace("sandpod", "")


def test_cleanup_of_a_clean_table_is_nothing() -> None:
    clean = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\nCOMMIT\n"
    assert cleanup_restore_text(parse_saved_filter_table(clean)) is None
