"""Per-execution egress grants: what the operator signs and the egress proxy verifies.

An execution whose allowlist names hosts gets proxy credentials (user `sandpod`, password a
token). The token carries the execution's host rules and an expiry, signed with a key that
only the operator and the proxy hold (HMAC-SHA256), so the proxy verifies it from the request
alone, and a token of one execution never opens another's hosts. It counts only from the pod
made for its execution (or session), which the proxy's binder knows from the pod's address
(sandpod_proxy.binder). Standard library only: the proxy's helper imports it too.

Token: base64url(payload JSON) "." base64url(HMAC(key, DOMAIN + payload part)), no padding.
"""

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

# Lowercase DNS names, optionally "*." + a name (every name below it, not the name itself).
# The last label starts with a letter, so that an IP literal is never a host name.
HOST_PATTERN = r"^(\*\.)?([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_HOST_CHARS = 253
DEFAULT_HOST_PORTS = (80, 443)
PROXY_USER = "sandpod"
DOMAIN = b"sandpod-egress-grant-v1."


def host_matches(pattern: str, host: str) -> bool:
    """Whether `host` (as a client names it: any case, maybe a trailing dot) is `pattern`."""
    host = host.lower().removesuffix(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def pattern_within(inner: str, outer: str) -> bool:
    """Whether every host `inner` matches is matched by `outer` too."""
    if inner == outer:
        return True
    if outer.startswith("*."):
        return host_matches(outer, inner.removeprefix("*."))
    return False


def valid_host_pattern(text: str) -> bool:
    return len(text) <= MAX_HOST_CHARS and re.fullmatch(HOST_PATTERN, text) is not None


@dataclass(frozen=True)
class HostGrant:
    pattern: str
    ports: tuple[int, ...] = DEFAULT_HOST_PORTS


@dataclass(frozen=True)
class Grant:
    """What one execution may reach through the proxy, until `expires` (Unix seconds)."""

    execution: str  # the CodeExecution's uid
    namespace: str
    expires: int
    hosts: tuple[HostGrant, ...]

    def allows(self, host: str, port: int) -> bool:
        return any(port in h.ports and host_matches(h.pattern, host) for h in self.hosts)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: str) -> str:
    return _b64(hmac.new(key, DOMAIN + payload.encode(), hashlib.sha256).digest())


def sign(grant: Grant, key: bytes) -> str:
    """The token for `grant` (URL-safe: it goes into a proxy URL's password as it is)."""
    payload = {
        "e": grant.execution,
        "n": grant.namespace,
        "x": grant.expires,
        "h": [[h.pattern, list(h.ports)] for h in grant.hosts],
    }
    part = _b64(json.dumps(payload, separators=(",", ":")).encode())
    return f"{part}.{_mac(key, part)}"


def verify(token: str, key: bytes, now: float) -> Grant | None:
    """The grant of a token signed with `key` and not expired at `now`, else None."""
    part, _, mac = token.partition(".")
    if not part or not hmac.compare_digest(mac.encode(), _mac(key, part).encode()):
        return None
    try:
        payload = json.loads(_unb64(part))
        grant = Grant(
            execution=str(payload["e"]),
            namespace=str(payload["n"]),
            expires=int(payload["x"]),
            hosts=tuple(
                HostGrant(str(p), tuple(int(n) for n in ports)) for p, ports in payload["h"]
            ),
        )
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None
    return grant if now < grant.expires else None


def from_proxy_authorization(header: str, key: bytes, now: float) -> Grant | None:
    """The grant in a `Proxy-Authorization: Basic ...` value (user sandpod, token as password)."""
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, token = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (ValueError, binascii.Error):
        return None
    return verify(token, key, now) if user == PROXY_USER else None


def proxy_url(token: str, address: str, port: int) -> str:
    """http://sandpod:<token>@address:port, for HTTP_PROXY and friends."""
    return f"http://{PROXY_USER}:{token}@{address}:{port}"
