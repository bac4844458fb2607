"""CodeExecutions: a cold run in a pod of its own (reconciler, builders), its kopf handlers,
and what keeps them going (stalls, resync)."""
