"""Serving: one run on a serving runner turned into a verified verdict (core), the runner's
client, and the direct path (direct, endpoint)."""
