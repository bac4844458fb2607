"""Squid external ACL helper: may this request go where it asks?

    external_acl_type sandpod_grant concurrency=N %>ha{Proxy-Authorization} %>rd %>rP \
        sandpod-proxy-grant-helper /etc/sandpod-proxy-key/key
    external_acl_type sandpod_server_name concurrency=N %>ha{Proxy-Authorization} %>rd %>rP \
        %ssl::>sni sandpod-proxy-grant-helper --server-name /etc/sandpod-proxy-key/key

Each line: channel, the Proxy-Authorization value, host, port, with --server-name the TLS
server name of the client's ClientHello (fields URL-escaped by Squid, "-" when empty; then
%DATA, "-", which is ignored). The first decides a request (HTTP by the URL's host, HTTPS by
the CONNECT name); the second, after Squid peeked at the ClientHello of an allowed CONNECT,
whether to splice it: only when the server name is the CONNECT name, so that a client cannot
reach another name through an allowed host's address. The answer: "OK log=<uid>/<namespace>"
when the execution's signed grant allows it, "ERR log=<uid>/<namespace>" when it does not,
"ERR" without a valid grant. Squid logs `log=` as %ea, which the monitor counts refusals by.
An allowed server name also tags the connection (`clt_conn_tag`, SPLICED_TAG): the CONNECT
Squid makes itself for the spliced tunnel has no Proxy-Authorization, only that tag.
"""

import sys
import time
import urllib.parse
from pathlib import Path

from sandpod_contract.egress_grant import from_proxy_authorization

SERVER_NAME_FLAG = "--server-name"
SPLICED_TAG = "sandpod-server-name-granted"


def same_name(first: str, second: str) -> bool:
    """Whether two DNS names are one (any case, a trailing dot ignored)."""
    return first.lower().removesuffix(".") == second.lower().removesuffix(".")


def decide(line: str, key: bytes, now: float, *, server_name: bool = False) -> str:
    """The answer to one request line (without its channel); with `server_name`, the line
    carries the TLS server name after the port and must name the CONNECT host."""
    fields = [urllib.parse.unquote(field) for field in line.split()]
    if len(fields) < (4 if server_name else 3):
        return "ERR"
    header, host, port = fields[:3]
    grant = from_proxy_authorization(header, key, now) if header != "-" else None
    if grant is None:
        return "ERR"
    who = urllib.parse.quote(f"{grant.execution}/{grant.namespace}", safe="/")
    allowed = port.isdigit() and grant.allows(host, int(port))
    if not server_name:
        return f"{'OK' if allowed else 'ERR'} log={who}"
    sni = fields[3]
    if allowed and sni != "-" and same_name(sni, host):
        return f"OK log={who} clt_conn_tag={SPLICED_TAG}"
    return f"ERR log={who}"


def main() -> None:
    arguments = sys.argv[1:]
    server_name = SERVER_NAME_FLAG in arguments
    key_path = next(a for a in arguments if a != SERVER_NAME_FLAG)
    key = Path(key_path).read_bytes().strip()
    for line in sys.stdin:
        channel, _, request = line.strip().partition(" ")
        answer = decide(request, key, time.time(), server_name=server_name)
        sys.stdout.write(f"{channel} {answer}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
