"""Names the operator, the gateway and the chart agree on: the API group and kind, the
label, annotation and finalizer keys, and how an execution's children are named."""

GROUP = "sandpod.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CodeExecution"
PLURAL = "codeexecutions"
SINGULAR = "codeexecution"
SHORT_NAMES = ("cx",)
CATEGORIES = ("sandpod",)

CANCEL_ANNOTATION = f"{GROUP}/cancel"
REQUEST_HASH_ANNOTATION = f"{GROUP}/request-sha256"
FINALIZER = f"{GROUP}/operator"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "sandpod"
EXECUTION_LABEL = f"{GROUP}/execution"
ROLE_LABEL = f"{GROUP}/role"
SANDBOX_ROLE = "sandbox"
TENANT_LABEL = f"{GROUP}/tenant"
# Set by the operator once an execution's status is terminal, so a tenant's unfinished
# executions can be counted from metadata alone (label selector "!finished").
FINISHED_LABEL = f"{GROUP}/finished"
# The record of a run that took the direct path (a run in a live session answered by its
# runner, its CodeExecution written behind by the operator): the operator's handlers leave
# it alone. Value: RECORD_DIRECT.
RECORD_LABEL = f"{GROUP}/record"
RECORD_DIRECT = "direct"
# An execution waiting for its tenant's turn (a Judge0 submission beyond the tenant's
# maxConcurrent): the operator's handlers leave it alone until its queue (executions/queue.py)
# removes the label. Value: the tenant's maxConcurrent, which the gateway set.
QUEUED_LABEL = f"{GROUP}/queued"
# The operator's endpoint of the direct path, which the gateway posts a session's run to.
DIRECT_RUN_PATH = "/v1/session-runs"
DIRECT_POOL_RUN_PATH = "/v1/pool-runs"
# Stops a direct run in progress, by its record's namespace and name (E2B's kill of a command).
DIRECT_CANCEL_PATH = "/v1/run-cancels"
# A direct run's answer with its output live, when the gateway asks for it (Accept).
NDJSON_MEDIA_TYPE = "application/x-ndjson"
# On the same port: the operator admits a tenant's creates against its counts (one decider for
# every gateway replica), and tells a tenant's use.
DIRECT_ADMISSION_PATH = "/v1/admissions"
DIRECT_USAGE_PATH = "/v1/usage"
# The operator's log lines with one run's milestones (wall-clock seconds, JSON), which the
# bench reads: `<marker> <namespace>/<name> {"posted": ..., ...}`. A warm run of the record
# path (a pool pod claimed for a CodeExecution), and a run of the direct path.
TIMINGS_LOG = "warm timings"
DIRECT_TIMINGS_LOG = "direct timings"
# Set by the operator on an execution it has seen without a status for a while
# (executions/resync.py): the change makes its watch deliver the execution again.
RESYNC_ANNOTATION = f"{GROUP}/resync-at"

POOL_KIND = "SandboxPool"
POOL_PLURAL = "sandboxpools"
POOL_SINGULAR = "sandboxpool"
POOL_SHORT_NAMES = ("sbp",)

SESSION_KIND = "CodeSession"
SESSION_PLURAL = "codesessions"
SESSION_SINGULAR = "codesession"
SESSION_SHORT_NAMES = ("cxs",)
# On a CodeSession: a time (ISO 8601, with its offset) at which the operator ends it
# (LifetimeExceeded) before its maxLifetimeSeconds run out; the gateway sets and moves it
# (E2B's sandbox timeout). A time past the lifetime, or one that does not parse, changes nothing.
SESSION_END_ANNOTATION = f"{GROUP}/end-at"

# (kind, plural, singular, short names) of each custom resource.
EXECUTION_NAMES = (KIND, PLURAL, SINGULAR, SHORT_NAMES)
POOL_NAMES = (POOL_KIND, POOL_PLURAL, POOL_SINGULAR, POOL_SHORT_NAMES)
SESSION_NAMES = (SESSION_KIND, SESSION_PLURAL, SESSION_SINGULAR, SESSION_SHORT_NAMES)
# A session's pod (cold or claimed from a pool) carries the session's name here.
SESSION_LABEL = f"{GROUP}/session"
# Appended to the serving runner's argv: many executions, one at a time, state kept.
SESSION_RUNNER_FLAG = "--session"
# Pool pods: which pool made them, whether they are still free, and (once claimed) by whom.
POOL_LABEL = f"{GROUP}/pool"
POOL_STATE_LABEL = f"{GROUP}/pool-state"
POOL_FREE = "free"
POOL_CLAIMED = "claimed"
CLAIMED_BY_LABEL = f"{GROUP}/claimed-by"
# On a one-off pool's pod once it has served a run: the tenant (label value) of its runs, the
# only one whose runs it takes ("" for executions without a tenant label).
SERVES_TENANT_LABEL = f"{GROUP}/serves-tenant"
# The pool spec a pod was made from (a hash): pods of an older spec are replaced.
POOL_TEMPLATE_LABEL = f"{GROUP}/pool-template"
# The serving runner's port in pool pods (docs: the warm design).
RUNNER_PORT_NAME = "runner"
RUNNER_PORT = 7070

_UID_PART = 8
_MAX_NAME = 63


def pool_runner_config_name(pool_name: str) -> str:
    """The ConfigMap with a pool's serve config (owned by the pool)."""
    return f"{pool_name}-runner"


def outputs_configmap_name(execution_name: str, uid: str) -> str:
    """The ConfigMap that holds an execution's output files (status.outputsConfigMap)."""
    return f"{child_name(execution_name, uid)}-outputs"


def child_name(execution_name: str, uid: str) -> str:
    """Deterministic name of an execution's children: one per CR instance, a valid DNS label.

    The uid part makes a re-created CR with the same name get new children, never the old.
    """
    suffix = uid.replace("-", "")[:_UID_PART]
    head = execution_name[: _MAX_NAME - _UID_PART - 1].rstrip("-.")
    return f"{head}-{suffix}"
