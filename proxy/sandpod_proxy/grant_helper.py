"""Squid external ACL helper: may this request go where it asks?

    external_acl_type sandpod_grant concurrency=N %>ha{Proxy-Authorization} %>rd %>rP %>a \
        sandpod-proxy-grant-helper --binder http://127.0.0.1:9182 /etc/sandpod-proxy-key/key
    external_acl_type sandpod_server_name concurrency=N %>ha{Proxy-Authorization} %>rd %>rP \
        %>a %ssl::>sni sandpod-proxy-grant-helper --server-name --binder ... KEY

Each line: channel, the Proxy-Authorization value, host, port, the client's address, with
--server-name the TLS server name of the client's ClientHello (fields URL-escaped by Squid,
"-" when empty; then %DATA, "-", which is ignored). The first decides a request (HTTP by the
URL's host, HTTPS by the CONNECT name); the second, after Squid peeked at the ClientHello of an
allowed CONNECT, whether to splice it: only when the server name is the CONNECT name, so that a
client cannot reach another name through an allowed host's address.

A grant is bound to its sandbox: it counts only when the client's address is that of the live
pod made for the grant's execution or session, as the binder (sandpod_proxy.binder) knows it.
A grant shown by any other pod, or by a pod since ended (a session's too), is refused as if it
were not there. The answer: "OK log=<uid>/<namespace>" when the execution's signed grant, shown
by its own pod, allows it, "ERR log=<uid>/<namespace>" when it does not, "ERR" without a valid
grant of that pod's. Squid logs `log=` as %ea, which the monitor counts refusals by, so another
pod's traffic is never counted as the grant's execution's. An allowed server name also tags the
connection (`clt_conn_tag`, SPLICED_TAG): the CONNECT Squid makes itself for the spliced tunnel
has no Proxy-Authorization, only that tag. Lines are answered concurrently (a pod's first
request may wait for the binder to learn its address), each by its channel.
"""

import argparse
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandpod_contract.egress_grant import from_proxy_authorization

SPLICED_TAG = "sandpod-server-name-granted"
# How long a request waits for the binder to learn its client's pod.
BINDING_WAIT_SECONDS = 8.0
# As many lines at once as Squid's `concurrency=` sends.
WORKERS = 100

# (namespace, uid) of the live sandbox pod at an address, None when there is none.
OwnerLookup = Callable[[str], tuple[str, str] | None]


def same_name(first: str, second: str) -> bool:
    """Whether two DNS names are one (any case, a trailing dot ignored)."""
    return first.lower().removesuffix(".") == second.lower().removesuffix(".")


def decide(
    line: str, key: bytes, now: float, owner_of: OwnerLookup, *, server_name: bool = False
) -> str:
    """The answer to one request line (without its channel); with `server_name`, the line
    carries the TLS server name after the client's address and must name the CONNECT host."""
    fields = [urllib.parse.unquote(field) for field in line.split()]
    if len(fields) < (5 if server_name else 4):
        return "ERR"
    header, host, port, client = fields[:4]
    grant = from_proxy_authorization(header, key, now) if header != "-" else None
    if grant is None or owner_of(client) != (grant.namespace, grant.execution):
        return "ERR"
    who = urllib.parse.quote(f"{grant.execution}/{grant.namespace}", safe="/")
    allowed = port.isdigit() and grant.allows(host, int(port))
    if not server_name:
        return f"{'OK' if allowed else 'ERR'} log={who}"
    sni = fields[4]
    if allowed and sni != "-" and same_name(sni, host):
        return f"OK log={who} clt_conn_tag={SPLICED_TAG}"
    return f"ERR log={who}"


def binder_lookup(binder: str, wait: float = BINDING_WAIT_SECONDS) -> OwnerLookup:
    """Asks the binder (a base URL on loopback) who holds an address; None when it does not
    say (no such pod, or the binder cannot be reached: the request is then refused)."""

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy

    def owner_of(client: str) -> tuple[str, str] | None:
        address = urllib.parse.quote(client, safe="")
        url = f"{binder}/owners/{address}?wait={wait}"
        try:
            with opener.open(url, timeout=wait + 2) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError):  # urllib.error.HTTPError (404) included
            return None
        if not isinstance(answer, dict):
            return None
        namespace, uid = answer.get("namespace"), answer.get("uid")
        return (namespace, uid) if isinstance(namespace, str) and isinstance(uid, str) else None

    return owner_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--server-name", action="store_true")
    parser.add_argument("--binder", required=True, help="the binder's base URL")
    parser.add_argument("--binding-wait", type=float, default=BINDING_WAIT_SECONDS)
    parser.add_argument("key", type=Path)
    args = parser.parse_args()
    key = args.key.read_bytes().strip()
    owner_of = binder_lookup(args.binder.rstrip("/"), args.binding_wait)
    answering = threading.Lock()

    def answer(channel: str, request: str) -> None:
        decision = decide(request, key, time.time(), owner_of, server_name=args.server_name)
        with answering:
            sys.stdout.write(f"{channel} {decision}\n")
            sys.stdout.flush()

    with ThreadPoolExecutor(WORKERS) as workers:
        for line in sys.stdin:
            channel, _, request = line.strip().partition(" ")
            workers.submit(answer, channel, request)


if __name__ == "__main__":
    main()
