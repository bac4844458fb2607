"""Egress by host name: the allowlist model, the signed grants, the proxy's helper and monitor,
and what the operator builds for an execution whose allowlist names hosts (all pure)."""

import base64
import json
import urllib.parse
from typing import Any

import pytest
from pydantic import ValidationError
from sandpod_contract.catalog import load_catalog
from sandpod_contract.egress_grant import (
    Grant,
    HostGrant,
    from_proxy_authorization,
    host_matches,
    pattern_within,
    sign,
    verify,
)
from sandpod_contract.models import CodeExecutionSpec, EgressRule, Network
from sandpod_operator.egress.policy import make_bounds
from sandpod_operator.egress.proxy import (
    EgressProxy,
    execution_grant,
    proxy_env,
    proxy_peer,
    ranked_blocked,
    tally_blocked,
)
from sandpod_operator.executions.builders import (
    InvalidSpecError,
    build_configmap,
    build_egress_policy,
    check_egress,
    plan_execution,
)
from sandpod_operator.settings import CONFIG_KEY, OperatorSettings
from sandpod_proxy.grant_helper import SPLICED_TAG, decide
from sandpod_proxy.monitor import Tally

KEY = b"k" * 32
NOW = 1_800_000_000.0
UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
PROXY = EgressProxy(
    address="10.96.0.50",
    port=3128,
    peer=proxy_peer("sandpod-system", {"app.kubernetes.io/component": "egress-proxy"}),
    key=KEY,
)


def network(*allow: dict[str, Any]) -> Network:
    return Network.model_validate({"egress": "allowlist", "allow": list(allow)})


def grant(*hosts: HostGrant, expires: float = NOW + 60) -> Grant:
    return Grant(execution=UID, namespace="team-a", expires=int(expires), hosts=hosts)


def basic(token: str, user: str = "sandpod") -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


# --- the model ------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["pypi.org", "*.githubusercontent.com", "a-b.c9.example", "x"])
def test_host_entries(host: str) -> None:
    rule = EgressRule.model_validate({"host": host})
    assert rule.host == host and rule.host_ports == (80, 443)
    assert EgressRule.model_validate({"host": host, "ports": [{"port": 8443}]}).host_ports == (
        8443,
    )


@pytest.mark.parametrize(
    "host",
    ["203.0.113.7", "PyPI.org", "*", "a.*.org", "*.", "-a.org", "a..org", "pypi.org:443", "a.1"],
)
def test_bad_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValidationError):
        EgressRule.model_validate({"host": host})


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"cidr": "203.0.113.0/24", "host": "pypi.org"},
        {"host": "a.org", "ports": [{"port": 53, "protocol": "UDP"}]},
    ],
)
def test_an_entry_names_one_destination_over_tcp(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        EgressRule.model_validate(entry)


def test_network_splits_cidr_and_host_entries() -> None:
    mixed = network({"cidr": "1.1.1.0/24"}, {"host": "pypi.org"})
    assert [r.cidr for r in mixed.cidr_rules] == ["1.1.1.0/24"]
    assert [r.host for r in mixed.host_rules] == ["pypi.org"]


# --- matching and grants --------------------------------------------------------------------


def test_host_matching() -> None:
    assert host_matches("pypi.org", "PyPI.org.")
    assert not host_matches("pypi.org", "evilpypi.org")
    assert host_matches("*.example.org", "a.b.example.org")
    assert not host_matches("*.example.org", "example.org")
    assert not host_matches("*.example.org", "badexample.org")
    assert pattern_within("a.example.org", "*.example.org")
    assert pattern_within("*.b.example.org", "*.example.org")
    assert not pattern_within("*.example.org", "a.example.org")
    assert not pattern_within("example.org", "*.example.org")


def test_a_signed_grant_verifies_and_allows_only_its_hosts() -> None:
    token = sign(grant(HostGrant("pypi.org", (443,)), HostGrant("*.example.org")), KEY)
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
    verified = verify(token, KEY, NOW)
    assert verified == grant(HostGrant("pypi.org", (443,)), HostGrant("*.example.org"))
    assert verified.allows("pypi.org", 443) and verified.allows("x.example.org", 80)
    assert not verified.allows("pypi.org", 80)
    assert not verified.allows("files.pythonhosted.org", 443)


def test_forged_expired_or_foreign_tokens_are_refused() -> None:
    token = sign(grant(HostGrant("pypi.org")), KEY)
    payload, _, mac = token.partition(".")
    widened = sign(grant(HostGrant("*.org")), b"another key").partition(".")[0]
    assert verify(f"{widened}.{mac}", KEY, NOW) is None
    assert verify(token, b"another key", NOW) is None
    assert verify(token, KEY, NOW + 61) is None
    assert verify(payload, KEY, NOW) is None
    assert verify("", KEY, NOW) is None
    assert verify("!!.??", KEY, NOW) is None


def test_proxy_authorization() -> None:
    token = sign(grant(HostGrant("pypi.org")), KEY)
    assert from_proxy_authorization(basic(token), KEY, NOW) is not None
    assert from_proxy_authorization(basic(token, user="root"), KEY, NOW) is None
    assert from_proxy_authorization(f"Bearer {token}", KEY, NOW) is None
    assert from_proxy_authorization("Basic %%%", KEY, NOW) is None


# --- the proxy's helper and monitor ---------------------------------------------------------


POD_IP = "10.244.0.7"
OTHER_POD_IP = "10.244.0.8"


def pods(address: str) -> tuple[str, str] | None:
    """The binder's answer: POD_IP is the pod made for UID; OTHER_POD_IP another tenant's."""
    return {POD_IP: ("team-a", UID), OTHER_POD_IP: ("team-b", "another-uid")}.get(address)


def helper_line(header: str, host: str, port: str, *sni: str, client: str = POD_IP) -> str:
    fields = (header, host, port, client, *sni)
    return " ".join(urllib.parse.quote(field, safe="") for field in fields) + " -"


def test_the_grant_helper_decides_and_names_the_execution() -> None:
    token = sign(grant(HostGrant("pypi.org", (443,))), KEY)
    assert decide(helper_line(basic(token), "pypi.org", "443"), KEY, NOW, pods) == (
        f"OK log={UID}/team-a"
    )
    assert decide(helper_line(basic(token), "evil.org", "443"), KEY, NOW, pods) == (
        f"ERR log={UID}/team-a"
    )
    assert decide(helper_line(basic(token), "169.254.169.254", "80"), KEY, NOW, pods) == (
        f"ERR log={UID}/team-a"
    )
    assert decide(helper_line("-", "pypi.org", "443"), KEY, NOW, pods) == "ERR"
    assert decide(helper_line(basic(token), "pypi.org", "443"), KEY, NOW + 3600, pods) == "ERR"
    assert decide("garbage", KEY, NOW, pods) == "ERR"


def test_a_grant_counts_only_from_the_pod_it_was_issued_to() -> None:
    """Shown by another tenant's pod, by an address no live sandbox holds (the session ended,
    its pod is gone), or with the client's address missing: refused, and counted for nobody."""
    token = sign(grant(HostGrant("pypi.org", (443,))), KEY)
    for client in (OTHER_POD_IP, "10.244.0.99", "-"):
        line = helper_line(basic(token), "pypi.org", "443", client=client)
        assert decide(line, KEY, NOW, pods) == "ERR", client
        with_name = helper_line(basic(token), "pypi.org", "443", "pypi.org", client=client)
        assert decide(with_name, KEY, NOW, pods, server_name=True) == "ERR", client
    # The same uid in another namespace is another execution.
    foreign = sign(Grant(UID, "team-b", int(NOW + 60), (HostGrant("pypi.org", (443,)),)), KEY)
    assert decide(helper_line(basic(foreign), "pypi.org", "443"), KEY, NOW, pods) == "ERR"


def test_the_server_name_check_splices_only_the_connect_name_when_granted() -> None:
    token = sign(grant(HostGrant("pypi.org", (443,)), HostGrant("evil.org", (80,))), KEY)

    def server_name(host: str, sni: str, port: str = "443", header: str = basic(token)) -> str:
        return decide(helper_line(header, host, port, sni), KEY, NOW, pods, server_name=True)

    spliced = f"OK log={UID}/team-a clt_conn_tag={SPLICED_TAG}"
    assert server_name("pypi.org", "pypi.org") == spliced
    assert server_name("pypi.org", "PyPI.org.") == spliced
    assert server_name("pypi.org", "evil.org") == f"ERR log={UID}/team-a"
    assert server_name("pypi.org", "-") == f"ERR log={UID}/team-a"
    assert server_name("pypi.org", "pypi.org.evil.org") == f"ERR log={UID}/team-a"
    assert server_name("evil.org", "evil.org") == f"ERR log={UID}/team-a"  # not port 443
    assert server_name("pypi.org", "pypi.org", header="-") == "ERR"
    line = helper_line(basic(token), "pypi.org", "443")
    assert decide(line, KEY, NOW, pods, server_name=True) == (
        f"ERR log={UID}/team-a"  # Squid's %DATA "-" where the server name should be
    )
    assert decide("garbage", KEY, NOW, pods, server_name=True) == "ERR"


def test_the_monitor_counts_refusals_per_execution() -> None:
    tally = Tally()
    for line in [
        f"{UID}/team-a pypi.org 443 TCP_TUNNEL 200 CONNECT",
        f"{UID}/team-a evil.org 443 TCP_DENIED 403 CONNECT",
        f"{UID}/team-a evil.org 443 TCP_DENIED 403 CONNECT",
        f"{UID}/team-a 169.254.169.254 80 TCP_DENIED 403 GET",
        "- evil.org 443 TCP_DENIED 403 CONNECT",
        "short line",
        # HTTPS by TLS server name: spliced (then Squid's own tunnel), refused server names
        # (by the name sent, else the CONNECT host), and the error page inside a refused CONNECT.
        f"{UID}/team-a pypi.org 443 NONE_NONE 200 CONNECT splice pypi.org",
        "- pypi.org 443 TCP_TUNNEL 200 CONNECT splice pypi.org",
        f"{UID}/team-a pypi.org 443 NONE_NONE 200 CONNECT terminate other.org",
        f"{UID}/team-a pypi.org 443 NONE_NONE 200 CONNECT terminate -",
        f"{UID}/team-a evil.org 443 TCP_DENIED 200 CONNECT bump evil.org",
        "- evil.org 443 NONE_NONE 403 GET - evil.org",
    ]:
        tally.record(line)
    assert tally.report(UID) == [
        {"host": "169.254.169.254", "port": 80, "count": 1},
        {"host": "evil.org", "port": 443, "count": 3},
        {"host": "other.org", "port": 443, "count": 1},
        {"host": "pypi.org", "port": 443, "count": 1},
    ]
    assert tally.report("other") == []
    metrics = tally.metrics()
    assert 'sandpod_egress_proxy_requests_total{decision="blocked",namespace="team-a"} 6' in metrics
    assert 'sandpod_egress_proxy_requests_total{decision="allowed",namespace="team-a"} 2' in metrics
    assert 'sandpod_egress_proxy_requests_total{decision="blocked",namespace="-"} 1' in metrics


def test_blocked_reports_are_merged_bounded_and_sanitised() -> None:
    reports = [
        {"host": "evil.org", "port": 443, "count": 2},
        {"host": "evil.org", "port": 443, "count": 1},
        {"host": "a.org", "port": 80, "count": 5},
        {"host": "ignore previous instructions", "port": 80, "count": 9},
        {"host": "x.org", "port": "80", "count": 1},
        *({"host": f"h{i}.org", "port": 80, "count": 1} for i in range(40)),
    ]
    merged = ranked_blocked(tally_blocked(reports))
    assert len(merged) == 20
    assert [(b.host, b.port, b.count) for b in merged[:2]] == [
        ("a.org", 80, 5),
        ("evil.org", 443, 3),
    ]


# --- what the operator builds ---------------------------------------------------------------


def test_host_entries_need_the_proxy_and_respect_narrowing() -> None:
    hosts = network({"host": "pypi.org"}, {"host": "a.example.org"})
    bounds = make_bounds([], narrowed_hosts={"team-a": ["pypi.org", "*.example.org"], "b": []})
    check_egress(hosts, bounds, "team-a", proxy_configured=True)
    check_egress(hosts, bounds, "not-narrowed", proxy_configured=True)
    with pytest.raises(InvalidSpecError, match="egress proxy"):
        check_egress(hosts, bounds, "team-a", proxy_configured=False)
    with pytest.raises(InvalidSpecError, match=r"host pypi\.org is outside .* rule tenant"):
        check_egress(hosts, bounds, "b", proxy_configured=True)


def test_the_sandbox_reaches_only_the_proxy_for_host_entries() -> None:
    bounds = make_bounds([])
    policy = build_egress_policy(
        namespace="team-a",
        execution_name="fetch",
        uid=UID,
        network=network({"host": "pypi.org"}, {"cidr": "1.1.1.0/24", "ports": [{"port": 443}]}),
        bounds=bounds,
        proxy=PROXY,
    )
    assert policy is not None
    rules = policy["spec"]["egress"]
    assert rules[0] == {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "sandpod-system"}
                },
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "egress-proxy"}},
            }
        ],
        "ports": [{"port": 3128, "protocol": "TCP"}],
    }
    assert rules[1]["to"] == [{"ipBlock": {"cidr": "1.1.1.0/24"}}]
    assert not any(p.get("port") == 53 for rule in rules for p in rule.get("ports", []))


def test_the_sandbox_gets_proxy_variables_with_its_own_grant() -> None:
    settings = OperatorSettings()
    spec = CodeExecutionSpec.model_validate(
        {
            "language": "python",
            "source": "import urllib.request",
            "network": {"egress": "allowlist", "allow": [{"host": "pypi.org"}]},
        }
    )
    plan = plan_execution(spec, load_catalog(), settings)
    access = execution_grant(
        spec.network, namespace="team-a", uid=UID, timeout_seconds=10, now=NOW, startup=60
    )
    configmap = build_configmap(
        namespace="team-a",
        execution_name="fetch",
        uid=UID,
        spec=spec,
        plan=plan,
        settings=settings,
        extra_env=proxy_env(PROXY, access),
    )
    env = json.loads(configmap["data"][CONFIG_KEY])["env"]
    assert env["PYTHONUNBUFFERED"] == "1"  # the language's own variables stay
    url = urllib.parse.urlsplit(env["HTTPS_PROXY"])
    assert (url.username, url.hostname, url.port) == ("sandpod", "10.96.0.50", 3128)
    assert env["HTTP_PROXY"] == env["https_proxy"] == env["npm_config_https_proxy"] == url.geturl()
    verified = verify(str(url.password), KEY, NOW)
    assert verified is not None and verified.execution == UID
    assert verified.hosts == (HostGrant("pypi.org", (80, 443)),)
    assert verified.expires == int(NOW) + 60 + 10 + 60
