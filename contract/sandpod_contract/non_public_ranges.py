"""Ranges that are not public unicast: IANA special-purpose registries, as ipaddress judges them
non-global, plus multicast, reserved, 6to4 and NAT64, which embed or reach anything. An egress
allowlist may not overlap them unless the administrator opened the entry. The operator checks
allowlists against this list; the chart's copy (charts/sandpod/files/non-public-ranges.yaml) is
generated from it (python -m sandpod_contract.chart_files)."""

NON_PUBLIC_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private network, RFC 1918"),
    ("100.64.0.0/10", "carrier-grade NAT, RFC 6598"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, cloud metadata 169.254.169.254"),
    ("172.16.0.0/12", "private network, RFC 1918"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation, TEST-NET-1"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private network, RFC 1918"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation, TEST-NET-2"),
    ("203.0.113.0/24", "documentation, TEST-NET-3"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved, broadcast"),
    ("::1/128", "loopback"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
    ("::/3", "outside global unicast 2000::/3: unspecified, IPv4-mapped, reserved"),
    ("4000::/2", "outside global unicast 2000::/3: reserved"),
    ("8000::/1", "outside global unicast 2000::/3: reserved, unique local, link-local"),
)
