"""Fake remote hosts on this machine: a public address and the cloud metadata address.

Hostile programs try to reach the internet and 169.254.169.254. No test traffic may leave
this machine, so those addresses live in a network namespace of our own (`sp-hostile-*`),
reached over a veth pair, with a small TCP listener inside that logs every connection.
Only traffic from the pod network is routed there (a policy-routing rule per address), so
the host's own view of those addresses never changes. `remove()` undoes everything.

The egress proxy's tests use a second one (`FAKE_INTERNET`, its own namespace, link and
routing table): web servers (HTTP and HTTPS, `WEB_SERVER`) on fake public addresses, which the
proxy reaches by names from its hosts file.
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
ROUTE_TABLE = "7407"  # also the policy-routing rules' priority


@dataclass(frozen=True)
class FakeNet:
    """Where fake hosts live: a network namespace, its veth link and routing, its addresses."""

    netns: str
    host_link: str
    netns_link: str
    host_link_address: str
    netns_link_address: str
    route_table: str
    addresses: tuple[str, ...]


HOSTILE_NET = FakeNet(
    NETNS, HOST_LINK, NETNS_LINK, HOST_LINK_ADDRESS, NETNS_LINK_ADDRESS, ROUTE_TABLE,
    FAKE_ADDRESSES,
)  # fmt: skip
WEB_ADDRESS = "203.0.113.20"  # allowed.fake, pypi.fake in the proxy's hosts file
OTHER_WEB_ADDRESS = "203.0.113.21"  # other.fake
HTTP_PORT = 8080
HTTPS_PORT = 8443
FAKE_INTERNET = FakeNet(
    "sp-egress-fake", "sp-egress-h", "sp-egress-n", "198.51.100.5", "198.51.100.6", "7408",
    (WEB_ADDRESS, OTHER_WEB_ADDRESS),
)  # fmt: skip

# Serves a directory over HTTP and HTTPS on every fake address: argv root, cert, key, the HTTP
# and HTTPS ports, then the addresses. GET /whoami answers the address that served it.
WEB_SERVER = r"""
import functools, http.server, ssl, sys, threading
root, cert, key, http_port, https_port = sys.argv[1:6]
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/whoami":
            body = f"fake internet {self.server.server_address[0]}\n".encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body); return
        super().do_GET()
    def log_message(self, *args): pass
handler = functools.partial(Handler, directory=root)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); context.load_cert_chain(cert, key)
for address in sys.argv[6:]:
    for port, tls in ((int(http_port), False), (int(https_port), True)):
        server = http.server.ThreadingHTTPServer((address, port), handler)
        if tls:
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

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
    """The fake hosts for pods in `pod_cidr`; `create()` then `remove()` (idempotent).
    By default the hostile suite's listener; `net` and `server` (a Python program run in the
    namespace with its arguments, printing "ready") make others."""

    pod_cidr: str
    log_path: Path
    net: FakeNet = HOSTILE_NET
    server: tuple[str, ...] = ()
    listener: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def create(self) -> None:
        self.remove()  # leftovers of an interrupted run
        net = self.net
        _ip("netns", "add", net.netns)
        _ip("link", "add", net.host_link, "type", "veth", "peer", "name", net.netns_link)
        _ip("link", "set", net.netns_link, "netns", net.netns)
        _ip("addr", "add", f"{net.host_link_address}/{LINK_PREFIX}", "dev", net.host_link)
        _ip("link", "set", net.host_link, "up")
        _ip("link", "set", "lo", "up", netns=net.netns)
        link_address = f"{net.netns_link_address}/{LINK_PREFIX}"
        _ip("addr", "add", link_address, "dev", net.netns_link, netns=net.netns)
        _ip("link", "set", net.netns_link, "up", netns=net.netns)
        _ip("route", "add", "default", "via", net.host_link_address, netns=net.netns)
        for address in net.addresses:
            _ip("addr", "add", f"{address}/32", "dev", "lo", netns=net.netns)
            _ip(
                "route", "add", f"{address}/32", "via", net.netns_link_address,
                "dev", net.host_link, "table", net.route_table,
            )  # fmt: skip
            _ip(
                "rule", "add", "priority", net.route_table, "from", self.pod_cidr,
                "to", f"{address}/32", "lookup", net.route_table,
            )  # fmt: skip
        self.log_path.write_text("")
        program = self.server or (LISTENER, str(self.log_path), str(LISTEN_PORT))
        self.listener = subprocess.Popen(
            ["ip", "netns", "exec", net.netns, sys.executable, "-c", *program],
            stdout=subprocess.PIPE,
        )
        assert self.listener.stdout is not None
        if self.listener.stdout.readline().strip() != b"ready":
            raise RuntimeError("the fake hosts' server did not start")

    def routed_here(self) -> bool:
        """Whether traffic from a pod to each fake address goes to the namespace (never out)."""
        source = str(next(ipaddress.ip_network(self.pod_cidr).hosts()) + 1)
        for address in self.net.addresses:
            route = _ip("route", "get", address, "from", source, "iif", "cni0", check=False)
            if f"dev {self.net.host_link}" not in route:
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
        net = self.net
        for address in net.addresses:
            while _ip("rule", "show", "priority", net.route_table, check=False).strip():
                _ip("rule", "del", "priority", net.route_table, check=False)
            _ip("route", "del", f"{address}/32", "table", net.route_table, check=False)
        _ip("link", "del", net.host_link, check=False)
        if net.netns in _ip("netns", "list", check=False).split():
            _ip("netns", "del", net.netns, check=False)
        deadline = time.monotonic() + 5
        while net.netns in _ip("netns", "list", check=False).split():
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)

    def leftovers(self) -> list[str]:
        """What of the fake hosts still exists on the host (empty after `remove()`)."""
        net, found = self.net, []
        if net.netns in _ip("netns", "list", check=False).split():
            found.append(f"netns {net.netns}")
        if _ip("link", "show", net.host_link, check=False).strip():
            found.append(f"link {net.host_link}")
        if _ip("rule", "show", "priority", net.route_table, check=False).strip():
            found.append(f"rule priority {net.route_table}")
        if _ip("route", "show", "table", net.route_table, check=False).strip():
            found.append(f"routes in table {net.route_table}")
        return found


@dataclass
class NetworkControl:
    """What a pod without any NetworkPolicy reaches: the path to each target exists."""

    peer_ip: str
    reached: dict[str, bool]
