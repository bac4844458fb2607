"""Fake remote hosts on this machine: a public address and the cloud metadata address.

Hostile programs try to reach the internet and 169.254.169.254. No test traffic may leave
this machine, so those addresses live in a network namespace of our own (`sp-hostile-*`),
reached over a veth pair, with a small TCP listener inside that logs every connection.
Only traffic from the pod network is routed there (a policy-routing rule per address), so
the host's own view of those addresses never changes. `remove()` undoes everything.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PUBLIC_ADDRESS = "203.0.113.10"  # TEST-NET-3, documentation only
METADATA_ADDRESS = "169.254.169.254"
FAKE_ADDRESSES = (PUBLIC_ADDRESS, METADATA_ADDRESS)
LISTEN_PORT = 80

NETNS = "sp-hostile-fake"
HOST_LINK = "sp-hostile-h"
NETNS_LINK = "sp-hostile-n"
# The veth link's own /30, from TEST-NET-2: only ever assigned here.
HOST_LINK_ADDRESS = "198.51.100.1"
NETNS_LINK_ADDRESS = "198.51.100.2"
LINK_PREFIX = 30
ROUTE_TABLE = "7407"
RULE_PRIORITY = "7407"

LISTENER = r"""
import socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[2])))
server.listen(64)
print("ready", flush=True)
def answer(conn):
    with conn:
        local = conn.getsockname()[0]
        log.write(f"{local} {conn.getpeername()[0]}\n")
        conn.sendall(f"sp-hostile-fake {local}\n".encode())
while True:
    conn, _ = server.accept()
    threading.Thread(target=answer, args=(conn,), daemon=True).start()
"""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    if check and completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {completed.stderr.strip()}")
    return completed.stdout


@dataclass
class FakeHosts:
    """The fake hosts for pods in `pod_cidr`; `create()` then `remove()` (idempotent)."""

    pod_cidr: str
    log_path: Path
    listener: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def create(self) -> None:
        self.remove()  # leftovers of an interrupted run
        _ip("netns", "add", NETNS)
        _ip("link", "add", HOST_LINK, "type", "veth", "peer", "name", NETNS_LINK)
        _ip("link", "set", NETNS_LINK, "netns", NETNS)
        _ip("addr", "add", f"{HOST_LINK_ADDRESS}/{LINK_PREFIX}", "dev", HOST_LINK)
        _ip("link", "set", HOST_LINK, "up")
        _ip("link", "set", "lo", "up", netns=NETNS)
        _ip("addr", "add", f"{NETNS_LINK_ADDRESS}/{LINK_PREFIX}", "dev", NETNS_LINK, netns=NETNS)
        _ip("link", "set", NETNS_LINK, "up", netns=NETNS)
        _ip("route", "add", "default", "via", HOST_LINK_ADDRESS, netns=NETNS)
        for address in FAKE_ADDRESSES:
            _ip("addr", "add", f"{address}/32", "dev", "lo", netns=NETNS)
            _ip(
                "route", "add", f"{address}/32", "via", NETNS_LINK_ADDRESS,
                "dev", HOST_LINK, "table", ROUTE_TABLE,
            )  # fmt: skip
            _ip(
                "rule", "add", "priority", RULE_PRIORITY, "from", self.pod_cidr,
                "to", f"{address}/32", "lookup", ROUTE_TABLE,
            )  # fmt: skip
        self.log_path.write_text("")
        self.listener = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, "-c", LISTENER,
             str(self.log_path), str(LISTEN_PORT)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.listener.stdout is not None
        if self.listener.stdout.readline().strip() != b"ready":
            raise RuntimeError("the fake hosts' listener did not start")

    def routed_here(self) -> bool:
        """Whether traffic from a pod to each fake address goes to the namespace (never out)."""
        source = str(next(ipaddress.ip_network(self.pod_cidr).hosts()) + 1)
        for address in FAKE_ADDRESSES:
            route = _ip("route", "get", address, "from", source, "iif", "cni0", check=False)
            if f"dev {HOST_LINK}" not in route:
                return False
        return True

    def connections(self) -> list[tuple[str, str]]:
        """(fake address, peer) of every connection the listener accepted so far."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        return [(line.split()[0], line.split()[1]) for line in lines if line.strip()]

    def remove(self) -> None:
        if self.listener is not None:
            self.listener.kill()
            self.listener.wait(timeout=10)
            self.listener = None
        for address in FAKE_ADDRESSES:
            while _ip("rule", "show", "priority", RULE_PRIORITY, check=False).strip():
                _ip("rule", "del", "priority", RULE_PRIORITY, check=False)
            _ip("route", "del", f"{address}/32", "table", ROUTE_TABLE, check=False)
        _ip("link", "del", HOST_LINK, check=False)
        if NETNS in _ip("netns", "list", check=False).split():
            _ip("netns", "del", NETNS, check=False)
        deadline = time.monotonic() + 5
        while NETNS in _ip("netns", "list", check=False).split() and time.monotonic() < deadline:
            time.sleep(0.1)

    def leftovers(self) -> list[str]:
        """What of the fake hosts still exists on the host (empty after `remove()`)."""
        found = []
        if NETNS in _ip("netns", "list", check=False).split():
            found.append(f"netns {NETNS}")
        if _ip("link", "show", HOST_LINK, check=False).strip():
            found.append(f"link {HOST_LINK}")
        if _ip("rule", "show", "priority", RULE_PRIORITY, check=False).strip():
            found.append(f"rule priority {RULE_PRIORITY}")
        if _ip("route", "show", "table", ROUTE_TABLE, check=False).strip():
            found.append(f"routes in table {ROUTE_TABLE}")
        return found


@dataclass
class NetworkControl:
    """What a pod without any NetworkPolicy reaches: the path to each target exists."""

    peer_ip: str
    reached: dict[str, bool]
    fake_connections: int
