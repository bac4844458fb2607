"""Host allowlists through the chart's egress proxy (Squid): credentials, policy, reports.

An execution (or a session) whose allowlist names hosts gets a signed grant
(sandpod_contract.egress_grant) as the password of its proxy URL, set in HTTP_PROXY and
friends; its NetworkPolicy opens the proxy's pods and nothing else for those entries (no DNS:
the proxy resolves). At the end (of each run in a session), the refusals the proxy's monitors
counted for it go into status.egressBlocked and Events.
"""

import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kopf
from sandpod_contract.egress_grant import Grant, HostGrant, proxy_url, sign
from sandpod_contract.models import (
    MAX_BLOCKED_REPORTED,
    MAX_TIMEOUT_SECONDS,
    BlockedEgress,
    Network,
)

from sandpod_operator.kube import KubeError, Manifest
from sandpod_operator.settings import OperatorSettings

logger = logging.getLogger(__name__)


# Whatever the program asked for is reported only in this alphabet (names, IPv4 and IPv6).
_REPORTABLE_HOST = re.compile(r"^[A-Za-z0-9.:_\[\]-]{1,253}$")
GRANT_MARGIN_SECONDS = 60
MONITOR_TIMEOUT_SECONDS = 3
# Per (host, port): how many requests the proxy refused.
Refusals = Counter[tuple[str, int]]


@dataclass(frozen=True)
class EgressProxy:
    """The proxy as a sandbox reaches it: its Service address, its pods as a NetworkPolicy
    peer, and the key that signs the sandbox's credentials."""

    address: str
    port: int
    peer: Manifest
    key: bytes = field(repr=False)


def proxy_peer(namespace: str, pod_labels: Mapping[str, str]) -> Manifest:
    """The proxy's pods as a NetworkPolicyPeer."""
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": dict(pod_labels)},
    }


def host_grant(network: Network, *, namespace: str, uid: str, until: float) -> Grant:
    """The host entries of one execution or session (`uid`), valid until `until` plus a
    margin."""
    return Grant(
        execution=uid,
        namespace=namespace,
        expires=int(until) + GRANT_MARGIN_SECONDS,
        hosts=tuple(HostGrant(str(rule.host), rule.host_ports) for rule in network.host_rules),
    )


def execution_grant(
    network: Network, *, namespace: str, uid: str, timeout_seconds: int, now: float, startup: int
) -> Grant:
    """The grant of one execution: its host entries, valid for as long as it may run."""
    until = now + startup + timeout_seconds
    return host_grant(network, namespace=namespace, uid=uid, until=until)


def session_grant(
    network: Network, *, namespace: str, uid: str, created: float, lifetime_seconds: int
) -> Grant:
    """The grant of a session's sandbox, the same whenever it is computed (each run's request
    must carry the env the pod started with): valid for the session's whole lifetime, from its
    creation, and for a run that starts just before that ends."""
    until = created + lifetime_seconds + MAX_TIMEOUT_SECONDS
    return host_grant(network, namespace=namespace, uid=uid, until=until)


def proxy_env(proxy: EgressProxy, grant: Grant) -> dict[str, str]:
    """The environment that makes standard clients (curl, requests, pip, npm, aiohttp with
    trust_env) use the proxy with this execution's credentials."""
    url = proxy_url(sign(grant, proxy.key), proxy.address, proxy.port)
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
        "npm_config_proxy": url,
        "npm_config_https_proxy": url,
    }


def proxy_rule(proxy: EgressProxy) -> Manifest:
    """A NetworkPolicy egress rule that opens the proxy's pods on its port, nothing else."""
    return {"to": [dict(proxy.peer)], "ports": [{"port": proxy.port, "protocol": "TCP"}]}


def tally_blocked(reports: Iterable[Mapping[str, Any]]) -> Refusals:
    """The monitors' answers ([{host, port, count}], one list per replica) added up;
    entries the proxy could not have written are dropped."""
    counts: Refusals = Counter()
    for entry in reports:
        host, port, count = entry.get("host"), entry.get("port"), entry.get("count")
        if not isinstance(host, str) or not _REPORTABLE_HOST.match(host):
            continue
        if isinstance(port, int) and isinstance(count, int) and 0 <= port <= 65535 and count > 0:
            counts[(host, port)] += count
    return counts


def ranked_blocked(counts: Refusals) -> list[BlockedEgress]:
    """Refusals as a bounded status list, most frequent first."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [
        BlockedEgress(host=host, port=port, count=count)
        for (host, port), count in ranked[:MAX_BLOCKED_REPORTED]
    ]


def blocked_between(before: Refusals, after: Refusals) -> list[BlockedEgress]:
    """What was refused between two looks at one grant's refusals (a session's runs, one at
    a time): the growth of each count. A count that fell (a proxy replica restarted or did
    not answer) adds nothing: the report is then a lower bound."""
    return ranked_blocked(after - before)


def blocked_message(blocked: list[BlockedEgress]) -> str:
    listed = ", ".join(f"{b.host}:{b.port} x{b.count}" for b in blocked)
    return f"the egress proxy refused requests to {listed}"


class ProxyClient:
    """Finds the proxy (its Service) and asks its monitors what they refused."""

    def __init__(self, kube: Any, settings: OperatorSettings) -> None:
        self._kube = kube
        self._settings = settings
        self._namespace, _, self._service = settings.egress_proxy_service.partition("/")
        self._resolved: EgressProxy | None = None

    async def resolve(self) -> EgressProxy | None:
        """The proxy, once its Service has an address (None until then)."""
        if self._resolved is not None:
            return self._resolved
        key_file = self._settings.egress_proxy_key_file
        if key_file is None:
            return None
        address = await self._kube.read_service_ip(self._namespace, self._service)
        if not address:
            return None
        self._resolved = EgressProxy(
            address=address,
            port=self._settings.egress_proxy_port,
            peer=proxy_peer(self._namespace, self._settings.egress_proxy_pod_labels),
            key=key_file.read_bytes().strip(),
        )
        return self._resolved

    async def access(self, grant: Grant) -> tuple[EgressProxy, dict[str, str]]:
        """The proxy and a sandbox's variables for `grant` (retried while the proxy's Service
        has no address)."""
        proxy = await self.resolve()
        if proxy is None:
            raise kopf.TemporaryError("the egress proxy's Service has no address yet", delay=5)
        return proxy, proxy_env(proxy, grant)

    async def blocked(self, uid: str) -> list[BlockedEgress]:
        """What every proxy replica refused for this execution (nothing when unknown)."""
        return ranked_blocked(await self.refusals(uid) or Counter())

    async def refusals(self, uid: str) -> Refusals | None:
        """What the proxy's replicas refused for this grant (execution or session) so far, best
        effort: a proxy that does not answer never holds up or fails a run. Replicas that do
        not answer are skipped (the counts are then a lower bound); None when unknown: the
        replicas could not be listed or none answered."""
        try:
            addresses = await self._kube.endpoint_addresses(self._namespace, self._service)
        except (KubeError, aiohttp.ClientError, TimeoutError) as error:
            logger.warning("egress proxy replicas: %s", error)
            return None
        reports: list[Mapping[str, Any]] = []
        answered = False
        timeout = aiohttp.ClientTimeout(total=MONITOR_TIMEOUT_SECONDS)
        port = self._settings.egress_proxy_monitor_port
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for address in addresses:
                host = f"[{address}]" if ":" in address else address
                try:
                    async with session.get(f"http://{host}:{port}/blocked/{uid}") as response:
                        answer = await response.json()
                except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                    logger.warning("egress proxy monitor %s: %s", address, error)
                    continue
                answered = True
                if isinstance(answer, list):
                    reports.extend(e for e in answer if isinstance(e, dict))
        return tally_blocked(reports) if answered else None
