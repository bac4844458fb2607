"""Squid external ACL helper: may this request go where it asks?

    external_acl_type sandpod_grant concurrency=N %>ha{Proxy-Authorization} %>rd %>rP \
        sandpod-proxy-grant-helper /etc/sandpod-proxy-key/key

Each line: channel, the Proxy-Authorization value, host, port (URL-escaped by Squid; then
%DATA, "-", which is ignored). The
answer: "OK log=<uid>/<namespace>" when the execution's signed grant allows host:port,
"ERR log=<uid>/<namespace>" when it does not, "ERR" without a valid grant. Squid logs `log=`
as %ea, which the monitor counts refusals by.
"""

import sys
import time
import urllib.parse
from pathlib import Path

from sandpod_contract.egress_grant import from_proxy_authorization


def decide(line: str, key: bytes, now: float) -> str:
    """The answer to one request line (without its channel)."""
    fields = [urllib.parse.unquote(field) for field in line.split()]
    if len(fields) < 3:
        return "ERR"
    header, host, port = fields[:3]
    grant = from_proxy_authorization(header, key, now) if header != "-" else None
    if grant is None:
        return "ERR"
    who = urllib.parse.quote(f"{grant.execution}/{grant.namespace}", safe="/")
    allowed = port.isdigit() and grant.allows(host, int(port))
    return f"{'OK' if allowed else 'ERR'} log={who}"


def main() -> None:
    key = Path(sys.argv[1]).read_bytes().strip()
    for line in sys.stdin:
        channel, _, request = line.strip().partition(" ")
        sys.stdout.write(f"{channel} {decide(request, key, time.time())}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
