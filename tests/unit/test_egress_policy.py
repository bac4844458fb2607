"""The egress bounds: which destinations an allowlist may name (a pure check, no I/O)."""

import ipaddress

import pytest
from sandpod_contract.non_public_ranges import NON_PUBLIC_RANGES
from sandpod_operator.egress.policy import (
    CLUSTER_NETWORK,
    PUBLIC_ONLY,
    TENANT,
    EgressBounds,
    excepts,
    make_bounds,
    parse_network,
    refusal,
)
from sandpod_operator.settings import OperatorSettings

NODE = "8.20.0.7"
API_SERVER = "8.20.0.1/32"
POD_CIDR = "8.21.0.0/16"
SERVICE_CIDR = "8.22.0.0/16"
TEST_NETWORK = "203.0.113.0/24"


def bounds(**changes: object) -> EgressBounds:
    settings = OperatorSettings.model_validate(
        {
            "egress_node_cidrs": [NODE],
            "egress_pod_cidrs": [POD_CIDR],
            "egress_service_cidrs": [SERVICE_CIDR],
            "egress_api_server_cidrs": [API_SERVER],
            "egress_open_cidrs": [TEST_NETWORK],
            "egress_namespace_cidrs": {"narrow": ["1.1.1.0/24", "203.0.113.10/32"], "closed": []},
            **changes,
        }
    )
    return settings.egress_bounds


@pytest.mark.parametrize(
    ("cidr", "rule", "names"),
    [
        ("0.0.0.0/0", PUBLIC_ONLY, "0.0.0.0/8 (this network)"),
        ("10.0.0.0/8", PUBLIC_ONLY, "RFC 1918"),
        ("10.96.0.10/32", PUBLIC_ONLY, "RFC 1918"),
        ("169.254.169.254/32", PUBLIC_ONLY, "cloud metadata"),
        ("127.0.0.1/32", PUBLIC_ONLY, "loopback"),
        ("100.64.0.0/10", PUBLIC_ONLY, "carrier-grade NAT"),
        ("172.20.0.0/16", PUBLIC_ONLY, "RFC 1918"),
        ("192.168.1.1/32", PUBLIC_ONLY, "RFC 1918"),
        ("224.0.0.251/32", PUBLIC_ONLY, "multicast"),
        ("255.255.255.255/32", PUBLIC_ONLY, "reserved"),
        ("198.51.100.0/24", PUBLIC_ONLY, "TEST-NET-2"),
        ("0.0.0.0/1", PUBLIC_ONLY, "this network"),
        ("128.0.0.0/1", PUBLIC_ONLY, "169.254.0.0/16"),
        ("::/0", PUBLIC_ONLY, "::1/128 (loopback)"),
        ("::1/128", PUBLIC_ONLY, "loopback"),
        ("fe80::/10", PUBLIC_ONLY, "link-local"),
        ("fd00:ec2::254/128", PUBLIC_ONLY, "unique local"),
        ("ff02::1/128", PUBLIC_ONLY, "multicast"),
        ("::ffff:10.0.0.1/128", PUBLIC_ONLY, "IPv4-mapped"),
        ("2002:a00:1::/48", PUBLIC_ONLY, "6to4"),
        ("64:ff9b::a00:1/128", PUBLIC_ONLY, "NAT64"),
        (API_SERVER, CLUSTER_NETWORK, "the API server"),
        (f"{NODE}/32", CLUSTER_NETWORK, "a node"),
        ("8.21.3.4/32", CLUSTER_NETWORK, "the pod network"),
        ("8.22.0.10/32", CLUSTER_NETWORK, "the service network"),
        ("8.0.0.0/8", CLUSTER_NETWORK, "8.20.0.7/32 (a node)"),
    ],
)
def test_refused_entries_name_the_range_and_rule(cidr: str, rule: str, names: str) -> None:
    message = refusal(["1.1.1.1/32", cidr], bounds(), "ns")
    assert message is not None
    assert message.startswith(f"spec.network.allow: {cidr} overlaps "), message
    assert f"egress rule {rule}: " in message
    assert names in message


@pytest.mark.parametrize(
    "cidr",
    ["1.1.1.1/32", "8.8.8.0/24", "93.184.216.34/32", "2a00:1450:4001::/48", "2606:4700::1111/128"],
)
def test_public_addresses_are_allowed(cidr: str) -> None:
    assert refusal([cidr], bounds(), "ns") is None


@pytest.mark.parametrize("cidr", ["203.0.113.10/32", TEST_NETWORK])
def test_opened_ranges_are_allowed(cidr: str) -> None:
    assert refusal([cidr], bounds(), "ns") is None
    assert refusal([cidr], bounds(egress_open_cidrs=[]), "ns") is not None


def test_an_opened_range_opens_cluster_ranges_inside_it() -> None:
    """DNS (in the service network) only when the administrator opens it."""
    dns = "8.22.0.10/32"
    assert refusal([dns], bounds(), "ns") is not None
    assert refusal([dns], bounds(egress_open_cidrs=[dns]), "ns") is None


def test_an_entry_straddling_an_opened_range_is_refused() -> None:
    message = refusal(["203.0.0.0/16"], bounds(), "ns")
    assert message is not None and "TEST-NET-3" in message


def test_without_cluster_ranges_only_the_public_rule_applies() -> None:
    plain = make_bounds([])
    assert refusal([API_SERVER], plain, "ns") is None
    assert refusal(["10.0.0.1/32"], plain, "ns") is not None


def test_narrowed_namespaces() -> None:
    assert refusal(["1.1.1.0/25", "203.0.113.10/32"], bounds(), "narrow") is None
    message = refusal(["1.1.1.0/24", "8.8.8.8/32"], bounds(), "narrow")
    assert message == (
        "spec.network.allow: 8.8.8.8/32 is outside this namespace's egress ranges; "
        f"egress rule {TENANT}: an allowlist in this namespace may name only "
        "1.1.1.0/24,203.0.113.10/32"
    )
    closed = refusal(["1.1.1.1/32"], bounds(), "closed")
    assert closed is not None and closed.endswith("may name only nothing")
    # Narrowing never widens: the platform's rules come first.
    platform = refusal(["203.0.113.10/32"], bounds(egress_open_cidrs=[]), "narrow")
    assert platform is not None and f"egress rule {PUBLIC_ONLY}" in platform


def test_excepts_leave_out_excluded_ranges_inside_an_entry() -> None:
    assert excepts("8.0.0.0/8", bounds()) == [API_SERVER, f"{NODE}/32", POD_CIDR, SERVICE_CIDR]
    assert excepts("1.1.1.1/32", bounds()) == []
    assert excepts(TEST_NETWORK, bounds()) == []
    # Nested ranges collapse to the outer one.
    everything = excepts("0.0.0.0/0", bounds(egress_open_cidrs=[]))
    assert "10.0.0.0/8" in everything and "8.21.0.0/16" in everything
    assert "203.0.113.0/24" in everything
    assert excepts("0.0.0.0/0", bounds(egress_open_cidrs=["0.0.0.0/0"])) == []


def test_the_non_public_list_agrees_with_ipaddress() -> None:
    """Every address ipaddress judges non-global is in a listed range; multicast too."""
    listed = [parse_network(cidr) for cidr, _ in NON_PUBLIC_RANGES]

    def covered(address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip in network for network in listed)

    samples = [str(net[0]) for net in listed] + [str(net[-1]) for net in listed]
    samples += ["100.63.255.255", "100.128.0.0", "192.0.0.9", "192.0.0.170", "2001:1::1"]
    for address in samples:
        assert ipaddress.ip_address(address).is_global or covered(address), address
    for public in ["1.1.1.1", "8.8.8.8", "2a00:1450::1", "2001:4860::8888", "2606:4700::1111"]:
        assert ipaddress.ip_address(public).is_global and not covered(public), public


def test_settings_refuse_bad_ranges() -> None:
    with pytest.raises(ValueError, match="host bits"):
        OperatorSettings(egress_pod_cidrs=["10.244.0.1/16"])
    with pytest.raises(ValueError):
        OperatorSettings(egress_open_cidrs=["not-a-range"])
