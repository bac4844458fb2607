"""SandboxPools: the pure builders, and the PoolController against the in-memory API server
(fill, refill after a claim, the refill rate limit, scaling down, invalid specs, deletion)."""

import asyncio
import json
import os
from datetime import UTC, datetime
from typing import Any

import pytest
from fake_clock import FakeClock
from fake_kube import FakeKube, Key, Manifest, ready_status
from sandpod_contract.catalog import Catalog, load_catalog
from sandpod_contract.models import CodeExecutionSpec, SandboxPoolSpec
from sandpod_contract.names import (
    CLAIMED_BY_LABEL,
    POOL_LABEL,
    POOL_STATE_LABEL,
    POOL_TEMPLATE_LABEL,
    ROLE_LABEL,
    SANDBOX_ROLE,
)
from sandpod_operator.executions.builders import (
    InvalidSpecError,
    build_pod,
    build_runner_config,
    plan_execution,
)
from sandpod_operator.kube import KubeError
from sandpod_operator.pools.builders import (
    RUNNER_INGRESS_POLICY_NAME,
    build_pool_configmap,
    build_pool_pod,
    build_runner_ingress_policy,
    plan_pool,
)
from sandpod_operator.pools.controller import PoolController
from sandpod_operator.settings import OperatorSettings

NAMESPACE = "team-a"
OPERATOR_PEER = {"ipBlock": {"cidr": "192.0.2.2/32"}}


@pytest.fixture(autouse=True)
def no_sandpod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("SANDPOD_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings(runner_ingress_from=[OPERATOR_PEER])


@pytest.fixture
def pools(kube: FakeKube, settings: OperatorSettings, catalog: Catalog, clock: FakeClock) -> Any:
    return PoolController(kube=kube, settings=settings, catalog=catalog, clock=clock)


def pool_spec(**fields: Any) -> SandboxPoolSpec:
    return SandboxPoolSpec.model_validate({"language": "python", "size": 2, **fields})


def add_pool(kube: FakeKube, name: str = "py", **spec: Any) -> Manifest:
    body = {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"language": "python", "size": 2, **spec},
    }
    return kube.add_pool(body)


def latest(kube: FakeKube, name: str = "py") -> Manifest:
    return json.loads(json.dumps(kube.pools[(NAMESPACE, name)]))


async def settle(pools: PoolController, kube: FakeKube, name: str = "py") -> float | None:
    """One pass over the pool as kopf's daemon would run it (with its latest body)."""
    return await pools.reconcile(latest(kube, name))


def pods_of(kube: FakeKube, state: str = "free") -> list[Key]:
    return [
        key
        for key, pod in kube.pods.items()
        if pod["metadata"]["labels"].get(POOL_STATE_LABEL) == state
    ]


def make_ready(kube: FakeKube, *keys: Key) -> None:
    for key in keys or tuple(kube.pods):
        image = kube.pods[key]["spec"]["containers"][0]["image"]
        kube.set_pod_status(*key, ready_status(datetime.now(UTC), image=image))


def status(kube: FakeKube, name: str = "py") -> Manifest:
    return dict(kube.pools[(NAMESPACE, name)].get("status") or {})


def ready_condition(kube: FakeKube, name: str = "py") -> Manifest:
    (condition,) = [c for c in status(kube, name)["conditions"] if c["type"] == "Ready"]
    return dict(condition)


# --- builders -----------------------------------------------------------------------------


def test_pool_pod_is_the_hardened_sandbox_pod_that_serves(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    spec = pool_spec(resources={"cpu": "1", "memory": "512Mi"})
    sandbox = plan_pool(spec, catalog, settings)
    configmap = build_pool_configmap(
        namespace=NAMESPACE, pool_name="py", spec=spec, sandbox=sandbox, settings=settings
    )
    pod = build_pool_pod(
        namespace=NAMESPACE, pool_name="py", sandbox=sandbox, configmap=configmap, settings=settings
    )
    assert pod["metadata"]["generateName"] == "py-"
    labels = pod["metadata"]["labels"]
    assert labels[ROLE_LABEL] == SANDBOX_ROLE  # the deny-all policy selects it
    assert (labels[POOL_LABEL], labels[POOL_STATE_LABEL]) == ("py", "free")
    spec = pod["spec"]
    assert "activeDeadlineSeconds" not in spec
    container = spec["containers"][0]
    assert container["command"] == [
        "/opt/sandpod/bin/sandpod-runner",
        "--serve",
        "/sandbox/input/config.json",
    ]
    assert container["ports"] == [{"name": "runner", "containerPort": 7070, "protocol": "TCP"}]
    assert container["readinessProbe"] == {
        "httpGet": {"path": "/ready", "port": "runner"},
        "periodSeconds": 1,
    }
    assert container["resources"]["limits"]["cpu"] == "1"
    assert spec["volumes"][0]["configMap"]["name"] == "py-runner"
    # Everything else is the one-off sandbox pod's hardening, from the same builder.
    execution = CodeExecutionSpec.model_validate(
        {"language": "python", "source": "", "resources": {"cpu": "1", "memory": "512Mi"}}
    )
    cold_plan = plan_execution(execution, catalog, settings)
    cold = build_pod(
        namespace=NAMESPACE, execution_name="x", uid="0a1b2c3d", plan=cold_plan, settings=settings
    )["spec"]
    cold.pop("activeDeadlineSeconds")
    cold_container, pool_container = cold["containers"][0], dict(container)
    for different in ("command", "ports", "readinessProbe"):
        cold_container.pop(different, None)
        pool_container.pop(different)
    assert pool_container == cold_container
    assert {**spec, "containers": [], "volumes": spec["volumes"][1:]} == {
        **cold,
        "containers": [],
        "volumes": cold["volumes"][1:],
    }


def test_serve_config_is_a_complete_run_config_without_an_execution(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    spec = pool_spec()
    sandbox = plan_pool(spec, catalog, settings)
    configmap = build_pool_configmap(
        namespace=NAMESPACE, pool_name="py", spec=spec, sandbox=sandbox, settings=settings
    )
    config = json.loads(configmap["data"]["config.json"])
    assert config["command"] == ["python3", "main.py"]
    assert config["sourceFile"] == "main.py"
    assert config["env"]["PYTHONUNBUFFERED"] == "1"
    assert config["limits"]["processes"] == settings.process_limit
    # The runner checks it as any config.json; each request brings its execution's own values.
    assert config["mode"] == "run" and config["timeoutSeconds"] > 0
    assert (config["args"], config["files"], config["hasStdin"]) == ([], [], False)
    # A pod serves many runs, each in its own box, for a bounded time.
    assert (config["maxRuns"], config["maxAgeSeconds"]) == (100, 3600)


def test_a_pool_says_how_many_runs_a_pod_serves(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    def served(**fields: Any) -> dict[str, Any]:
        spec = pool_spec(**fields)
        sandbox = plan_pool(spec, catalog, settings)
        configmap = build_pool_configmap(
            namespace=NAMESPACE, pool_name="py", spec=spec, sandbox=sandbox, settings=settings
        )
        return dict(json.loads(configmap["data"]["config.json"]))

    one = served(runsPerSandbox=1, sandboxMaxAgeSeconds=60)
    assert (one["maxRuns"], one["maxAgeSeconds"]) == (1, 60)
    # Sessions keep their pod for themselves: no boxes.
    assert "maxRuns" not in served(sessions=True)


@pytest.mark.parametrize("language", ["go", "csharp"])
def test_a_compiled_languages_pool_builds_as_its_runs_do(
    language: str, catalog: Catalog, settings: OperatorSettings
) -> None:
    """The runner serves a run only with the serve config's compile step (and command, env),
    and builds it in the claimed sandbox; a run's request carries the catalog's."""
    pool = pool_spec(language=language)
    sandbox = plan_pool(pool, catalog, settings)
    configmap = build_pool_configmap(
        namespace=NAMESPACE, pool_name=language, spec=pool, sandbox=sandbox, settings=settings
    )
    served = json.loads(configmap["data"]["config.json"])
    spec = CodeExecutionSpec(language=language, source="x")
    run = build_runner_config(spec, plan_execution(spec, catalog, settings), settings)
    assert (
        served["compileCommand"]
        == run["compileCommand"]
        == catalog.languages[language].compile_command
    )
    assert served["compileTimeoutSeconds"] == run["compileTimeoutSeconds"] == 30
    assert (served["command"], served["env"]) == (run["command"], run["env"])


def test_template_changes_with_what_the_pod_is_made_of(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    def template(spec: SandboxPoolSpec) -> str:
        sandbox = plan_pool(spec, catalog, settings)
        configmap = build_pool_configmap(
            namespace=NAMESPACE, pool_name="py", spec=spec, sandbox=sandbox, settings=settings
        )
        pod = build_pool_pod(
            namespace=NAMESPACE,
            pool_name="py",
            sandbox=sandbox,
            configmap=configmap,
            settings=settings,
        )
        return str(pod["metadata"]["labels"][POOL_TEMPLATE_LABEL])

    assert template(pool_spec()) == template(pool_spec(size=9))
    assert template(pool_spec()) != template(pool_spec(language="bash"))
    assert template(pool_spec()) != template(pool_spec(resources={"memory": "128Mi"}))


def test_plan_refuses_what_this_installation_cannot_run(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    with pytest.raises(InvalidSpecError, match=r"spec.language: unknown language 'cobol'"):
        plan_pool(pool_spec(language="cobol"), catalog, settings)
    with pytest.raises(InvalidSpecError, match=r"spec.resources.memory: 4Gi exceeds"):
        plan_pool(pool_spec(resources={"memory": "4Gi"}), catalog, settings)


def test_runner_ingress_only_from_the_operator() -> None:
    policy = build_runner_ingress_policy(NAMESPACE, [OPERATOR_PEER])
    assert policy is not None
    assert policy["metadata"]["name"] == RUNNER_INGRESS_POLICY_NAME
    assert policy["spec"] == {
        "podSelector": {"matchExpressions": [{"key": POOL_LABEL, "operator": "Exists"}]},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [OPERATOR_PEER], "ports": [{"protocol": "TCP", "port": 7070}]}],
    }
    # No peers: no policy at all (an empty `from` would let anyone in).
    assert build_runner_ingress_policy(NAMESPACE, []) is None


# --- the controller -----------------------------------------------------------------------


async def test_fills_the_pool_and_reports_ready_over_total(
    pools: PoolController, kube: FakeKube
) -> None:
    pool = add_pool(kube)
    assert await settle(pools, kube) is None
    free = pods_of(kube)
    assert len(free) == 2
    for key in free:
        owners = kube.pods[key]["metadata"]["ownerReferences"]
        assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [
            ("SandboxPool", pool["metadata"]["uid"], True)
        ]
    assert (status(kube)["ready"], status(kube)["total"]) == (0, 2)
    assert ready_condition(kube)["reason"] == "Filling"
    assert status(kube)["observedGeneration"] == 1
    # The serve config, the deny-all and the runner ingress policy are in place.
    assert (NAMESPACE, "py-runner") in kube.configmaps
    assert {name for _, name in kube.network_policies} == {
        "sandpod-sandbox-deny-all",
        RUNNER_INGRESS_POLICY_NAME,
    }
    make_ready(kube)
    await settle(pools, kube)
    assert (status(kube)["ready"], status(kube)["total"]) == (2, 2)
    assert ready_condition(kube)["status"] == "True"
    # Nothing more to do: a further pass creates nothing and writes nothing.
    calls = len(kube.calls)
    await settle(pools, kube)
    assert kube.calls[calls:] == ["list_pool_pods"]


async def test_a_claimed_pod_is_replaced_and_left_alone(
    pools: PoolController, kube: FakeKube
) -> None:
    add_pool(kube)
    await settle(pools, kube)
    make_ready(kube)
    claimed = pods_of(kube)[0]
    kube.claim_pod(claimed, "hello", "exec-uid-1")
    await settle(pools, kube)
    assert len(pods_of(kube)) == 2
    assert pods_of(kube, "claimed") == [claimed]
    assert kube.pods[claimed]["metadata"]["labels"][CLAIMED_BY_LABEL] == "exec-uid-1"
    assert (status(kube)["ready"], status(kube)["total"]) == (1, 2)
    # Shrinking to nothing deletes the free pods only.
    kube.update_pool_spec(NAMESPACE, "py", {"size": 0})
    await settle(pools, kube)
    assert pods_of(kube) == []
    assert pods_of(kube, "claimed") == [claimed]
    assert status(kube)["observedGeneration"] == 2


async def test_refill_rate_is_limited(
    pools: PoolController, kube: FakeKube, clock: FakeClock
) -> None:
    add_pool(kube, size=3, maxRefillPerMinute=2)
    delay = await settle(pools, kube)
    assert len(pods_of(kube)) == 2
    assert delay == pytest.approx(60)
    assert ready_condition(kube)["reason"] == "RefillLimited"
    clock.advance(30)
    assert await settle(pools, kube) == pytest.approx(30)
    assert len(pods_of(kube)) == 2
    clock.advance(30)
    assert await settle(pools, kube) is None
    assert len(pods_of(kube)) == 3
    # A claim right after: the window still holds the last start, one slot is free.
    kube.claim_pod(pods_of(kube)[0], "hello", "exec-uid-1")
    assert await settle(pools, kube) is None
    assert len(pods_of(kube)) == 3


async def test_scale_down_removes_pods_not_ready_first(
    pools: PoolController, kube: FakeKube
) -> None:
    add_pool(kube, size=3)
    await settle(pools, kube)
    ready = pods_of(kube)[:2]
    make_ready(kube, *ready)
    kube.update_pool_spec(NAMESPACE, "py", {"size": 2})
    await settle(pools, kube)
    assert sorted(pods_of(kube)) == sorted(ready)
    assert (status(kube)["ready"], status(kube)["total"]) == (2, 2)


async def test_a_pod_claimed_while_being_removed_survives(
    pools: PoolController, kube: FakeKube
) -> None:
    add_pool(kube, size=1)
    await settle(pools, kube)
    (key,) = pods_of(kube)
    kube.update_pool_spec(NAMESPACE, "py", {"size": 0})

    async def claim() -> None:
        kube.claim_pod(key, "hello", "exec-uid-1")

    kube.before("delete_pool_pod", claim)
    await settle(pools, kube)
    assert key in kube.pods
    assert pods_of(kube, "claimed") == [key]


async def test_dead_and_outdated_pods_are_replaced(pools: PoolController, kube: FakeKube) -> None:
    add_pool(kube)
    await settle(pools, kube)
    dead, other = pods_of(kube)
    kube.set_pod_status(*dead, {"phase": "Failed"})
    await settle(pools, kube)
    assert dead not in kube.pods and other in kube.pods
    assert len(pods_of(kube)) == 2
    kube.update_pool_spec(NAMESPACE, "py", {"language": "bash"})
    await settle(pools, kube)
    images = {kube.pods[key]["spec"]["containers"][0]["image"] for key in pods_of(kube)}
    assert images == {load_catalog().languages["bash"].image}
    config = json.loads(kube.configmaps[(NAMESPACE, "py-runner")]["data"]["config.json"])
    assert config["command"] == ["bash", "main.sh"]


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"language": "cobol"}, "unknown language 'cobol'"),
        ({"resources": {"cpu": "8"}}, "spec.resources.cpu: 8 exceeds"),
    ],
)
async def test_invalid_spec_starts_no_pods(
    pools: PoolController, kube: FakeKube, spec: Manifest, complaint: str
) -> None:
    add_pool(kube, **spec)
    assert await settle(pools, kube) is None
    assert kube.pods == {}
    condition = ready_condition(kube)
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert complaint in condition["message"]
    assert (status(kube)["ready"], status(kube)["total"]) == (0, 0)


async def test_a_pool_being_deleted_is_not_refilled(pools: PoolController, kube: FakeKube) -> None:
    add_pool(kube)
    await settle(pools, kube)
    kube.claim_pod(pods_of(kube)[0], "hello", "exec-uid-1")
    kube.pools[(NAMESPACE, "py")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await settle(pools, kube)
    assert len(pods_of(kube)) == 1


async def test_api_errors_reach_the_daemon(pools: PoolController, kube: FakeKube) -> None:
    add_pool(kube)
    kube.fail("create_pool_pod", KubeError(500, "InternalError", "etcd is away"))
    with pytest.raises(KubeError):
        await settle(pools, kube)
    await settle(pools, kube)  # the daemon's retry: no duplicate pods
    assert len(pods_of(kube)) == 2


async def test_a_poke_wakes_the_waiting_pass(pools: PoolController) -> None:
    key = (NAMESPACE, "py")
    waiting = asyncio.create_task(pools.wait(key, timeout=30))
    await asyncio.sleep(0)
    pools.poke(key)
    await asyncio.wait_for(waiting, timeout=1)
    # A poke while no pass waits is not lost: the next wait returns at once.
    pools.poke(key)
    await asyncio.wait_for(pools.wait(key, timeout=30), timeout=1)
