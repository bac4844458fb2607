"""Egress: the bounds of a sandbox's egress (a pure check) and the proxy grants that open it."""
