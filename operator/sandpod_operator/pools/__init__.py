"""SandboxPools: ready sandboxes kept per pool (controller, builders, handlers) and the warm
path that claims one for a run (warm)."""
