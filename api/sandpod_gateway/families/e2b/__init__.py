"""E2B's API and its sandboxes' data plane, over sandpod sessions (docs/e2b.md)."""
