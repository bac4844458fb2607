"""CodeSessions: a live sandbox per session that runs its executions in order (controller)
and its kopf handlers."""
