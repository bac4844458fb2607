import base64
import json
import re
from typing import Any

import pytest
from pydantic import ValidationError
from sandpod_contract.catalog import Catalog
from sandpod_contract.models import CodeExecutionSpec, Network
from sandpod_contract.names import child_name
from sandpod_contract.runner import VerifiedFile
from sandpod_operator.executions import builders
from sandpod_operator.executions.builders import (
    DENY_ALL_POLICY_NAME,
    InvalidSpecError,
    Manifest,
    Plan,
)
from sandpod_operator.settings import RUNNER_PATH, OperatorSettings

pytestmark = pytest.mark.usefixtures("clean_environment")

UID = "0a1b2c3d-4e5f-6789-abcd-ef0123456789"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.fixture
def settings() -> OperatorSettings:
    return OperatorSettings()


def spec(**fields: Any) -> CodeExecutionSpec:
    return CodeExecutionSpec.model_validate({"language": "python", "source": "print(1)", **fields})


def plan(catalog: Catalog, settings: OperatorSettings, **fields: Any) -> Plan:
    return builders.plan_execution(spec(**fields), catalog, settings)


def test_child_names_are_deterministic_labels() -> None:
    assert child_name("hello", UID) == "hello-0a1b2c3d"
    assert child_name("hello", UID) == child_name("hello", UID)
    assert child_name("hello", UID) != child_name("hello", "ffffffff-0000")
    long_name = child_name("a" * 60 + "-xyz", UID)
    assert len(long_name) <= 63 and DNS_LABEL.match(long_name)
    assert DNS_LABEL.match(child_name("a" * 53 + "-" + "b" * 9, UID))


def test_plan_applies_defaults(catalog: Catalog, settings: OperatorSettings) -> None:
    planned = plan(catalog, settings)
    assert planned.runtime_class_name == "gvisor"
    assert planned.cpu == settings.default_cpu
    assert planned.memory == settings.default_memory
    assert planned.ttl_seconds_after_finished == settings.default_ttl_seconds
    assert planned.language.file == "main.py"
    custom = plan(catalog, settings, resources={"memory": "1Gi"}, ttlSecondsAfterFinished=0)
    assert custom.memory == "1Gi"
    assert custom.ttl_seconds_after_finished == 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"language": "cobol"}, "spec.language"),
        ({"language": "bash", "mode": "lint"}, "spec.mode"),
        ({"language": "bash", "mode": "lint", "lint": {"select": ["E"]}}, "spec.mode"),
        ({"language": "javascript", "lint": {"select": ["E"]}}, "spec.lint"),
        ({"resources": {"memory": "32Gi"}}, "spec.resources.memory"),
        ({"resources": {"cpu": "8"}}, "spec.resources.cpu"),
        ({"runtimeClassName": "runc"}, "spec.runtimeClassName"),
        ({"files": [{"path": "main.py", "content": ""}]}, "spec.files"),
        ({"source": "€" * 200_000, "stdin": "€" * 200_000}, "spec.source"),
    ],
)
def test_plan_refuses_what_this_installation_cannot_run(
    catalog: Catalog, settings: OperatorSettings, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpecError, match=re.escape(field)):
        plan(catalog, settings, **fields)


def test_plan_honours_lower_timeout_maximum(catalog: Catalog) -> None:
    strict = OperatorSettings(max_timeout_seconds=30)
    with pytest.raises(InvalidSpecError, match=r"spec\.timeoutSeconds"):
        plan(catalog, strict, timeoutSeconds=60)


def test_allowed_runtime_classes(catalog: Catalog) -> None:
    settings = OperatorSettings(allowed_runtime_classes=["kata"])
    assert plan(catalog, settings, runtimeClassName="kata").runtime_class_name == "kata"


def test_runner_config_follows_the_protocol(catalog: Catalog, settings: OperatorSettings) -> None:
    parsed = spec(
        args=["-v"],
        stdin="in",
        files=[{"path": "data/a.csv", "content": "1"}, {"path": "b.txt", "content": "2"}],
        mode="lint",
        timeoutSeconds=7,
    )
    config = builders.build_runner_config(
        parsed, builders.plan_execution(parsed, catalog, settings), settings
    )
    assert config == {
        "mode": "lint",
        "sourceFile": "main.py",
        "command": ["python3", "main.py"],
        "lintCommand": [
            "ruff",
            "check",
            "--output-format=json",
            "--no-cache",
            "--isolated",
            "main.py",
            "--select=ALL",
            "--ignore=COM812,CPY,D100,D203,D213,FBT,RUF029",
        ],
        "args": ["-v"],
        "env": {
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "module://sandpod_mpl",
            "MPLCONFIGDIR": "/tmp/matplotlib",
        },
        "timeoutSeconds": 7,
        "maxOutputBytes": 1024 * 1024,
        "maxOutputFiles": 64,
        "maxOutputFilesBytes": 8 * 1024 * 1024,
        "files": [{"key": "file-0", "path": "data/a.csv"}, {"key": "file-1", "path": "b.txt"}],
        "hasStdin": True,
        "limits": {"processes": 128, "fileSizeBytes": 100 * 1024 * 1024, "openFiles": 1024},
        "memoryLimitBytes": 256 * 1024 * 1024,
    }


def test_an_executions_lint_rules_replace_the_languages(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    parsed = spec(mode="lint", lint={"select": ["E", "F401"]})
    config = builders.build_runner_config(
        parsed, builders.plan_execution(parsed, catalog, settings), settings
    )
    assert config["lintCommand"][-2:] == ["main.py", "--select=E,F401"]


@pytest.mark.parametrize("rule", ["--config=x.toml", "e501", "E 5", "", "A" * 17])
def test_lint_rules_are_rule_codes_never_options(rule: str) -> None:
    with pytest.raises(ValidationError):
        CodeExecutionSpec.model_validate(
            {"language": "python", "source": "", "mode": "lint", "lint": {"select": [rule]}}
        )


def configmap_of(
    parsed: CodeExecutionSpec, catalog: Catalog, settings: OperatorSettings
) -> Manifest:
    return builders.build_configmap(
        namespace="team-a",
        execution_name="hello",
        uid=UID,
        spec=parsed,
        plan=builders.plan_execution(parsed, catalog, settings),
        settings=settings,
    )


def test_configmap_carries_code_and_config(catalog: Catalog, settings: OperatorSettings) -> None:
    parsed = spec(source="print(2)", files=[{"path": "x.txt", "content": "hi"}])
    configmap = configmap_of(parsed, catalog, settings)
    assert configmap["metadata"]["name"] == "hello-0a1b2c3d"
    assert configmap["metadata"]["namespace"] == "team-a"
    assert configmap["immutable"] is True
    data = configmap["data"]
    assert data["source"] == "print(2)"
    assert data["file-0"] == "hi"
    assert "stdin" not in data
    assert json.loads(data["config.json"])["hasStdin"] is False


def test_binary_input_files_go_to_binary_data(catalog: Catalog, settings: OperatorSettings) -> None:
    files = [
        {"path": "a.bin", "content": "AAH/", "encoding": "base64"},
        {"path": "b.txt", "content": "t"},
    ]
    parsed = spec(files=files)
    configmap = configmap_of(parsed, catalog, settings)
    assert configmap["binaryData"] == {"file-0": "AAH/"}
    assert configmap["data"]["file-1"] == "t" and "file-0" not in configmap["data"]
    assert parsed.files[0].data() == b"\x00\x01\xff"


def test_a_base64_file_that_is_not_base64_is_refused() -> None:
    with pytest.raises(ValueError, match="not valid base64"):
        spec(files=[{"path": "a.bin", "content": "not base64!", "encoding": "base64"}])


def verified(path: str, content: bytes | None, size: int | None = None) -> VerifiedFile:
    size = len(content or b"") if size is None else size
    return VerifiedFile(path, size, "0" * 64, "text/plain", content)


def test_output_files_are_stored_in_order_while_they_fit() -> None:
    files = [
        verified("a.txt", b"a" * 60),
        verified("big.bin", b"b" * 50),
        verified("c.txt", b"c" * 40),
        verified("unkept.bin", None, 5),
    ]
    entries = builders.plan_outputs(files, 100)
    assert [(e["path"], e["stored"], e.get("key")) for e in entries] == [
        ("a.txt", True, "file-0"),
        ("big.bin", False, None),
        ("c.txt", True, "file-1"),
        ("unkept.bin", False, None),
    ]
    configmap = builders.build_outputs_configmap(
        namespace="ns", execution_name="hello", uid=UID, files=files, entries=entries
    )
    assert configmap is not None
    assert configmap["metadata"]["name"] == "hello-0a1b2c3d-outputs"
    assert configmap["binaryData"] == {
        "file-0": base64.b64encode(b"a" * 60).decode(),
        "file-1": base64.b64encode(b"c" * 40).decode(),
    }
    assert configmap["immutable"] is True and "data" not in configmap


def test_no_outputs_configmap_when_nothing_is_stored() -> None:
    files = [verified("big.bin", b"b" * 50)]
    entries = builders.plan_outputs(files, 10)
    assert (
        builders.build_outputs_configmap(
            namespace="ns", execution_name="hello", uid=UID, files=files, entries=entries
        )
        is None
    )


def test_pod_is_hardened(catalog: Catalog, settings: OperatorSettings) -> None:
    planned = plan(catalog, settings, timeoutSeconds=20, resources={"memory": "512Mi"})
    pod = builders.build_pod(
        namespace="ns", execution_name="hello", uid=UID, plan=planned, settings=settings
    )
    podspec = pod["spec"]
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "sandpod",
        "sandpod.dev/execution": "hello",
        "sandpod.dev/role": "sandbox",
    }
    assert podspec["runtimeClassName"] == "gvisor"
    assert podspec["automountServiceAccountToken"] is False
    assert podspec["enableServiceLinks"] is False
    assert podspec["restartPolicy"] == "Never"
    assert podspec["dnsPolicy"] == "None" and podspec["dnsConfig"]["nameservers"]
    assert podspec["hostname"] == "sandbox"
    assert podspec["terminationGracePeriodSeconds"] <= 2
    assert podspec["activeDeadlineSeconds"] > 20 + settings.pod_startup_timeout_seconds
    assert podspec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = podspec["containers"]
    assert container["image"] == "localhost/sandpod/python:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == [RUNNER_PATH, "/sandbox/input/config.json"]
    assert "env" not in container and "envFrom" not in container
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["terminationMessagePolicy"] == "File"
    resources = container["resources"]
    # The program's 512Mi (the runner's bound) and the runner's and gVisor's 64Mi.
    assert resources["limits"] == {"cpu": "500m", "memory": "576Mi", "ephemeral-storage": "256Mi"}
    assert resources["requests"] == {"cpu": "50m", "memory": "576Mi", "ephemeral-storage": "16Mi"}
    volumes = {v["name"]: v for v in podspec["volumes"]}
    assert volumes["input"]["configMap"]["name"] == "hello-0a1b2c3d"
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Mi"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/sandbox/input"]["readOnly"] is True
    assert set(mounts) == {"/sandbox/input", "/tmp"}


def test_small_limits_cap_requests(catalog: Catalog, settings: OperatorSettings) -> None:
    planned = plan(catalog, settings, resources={"cpu": "20m", "ephemeralStorage": "8Mi"})
    pod = builders.build_pod(
        namespace="ns", execution_name="x", uid=UID, plan=planned, settings=settings
    )
    container = pod["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "20m"
    assert container["resources"]["requests"]["ephemeral-storage"] == "8Mi"
    assert pod["spec"]["volumes"][1]["emptyDir"]["sizeLimit"] == "8Mi"


def test_scratch_is_never_larger_than_the_memory_limit(
    catalog: Catalog, settings: OperatorSettings
) -> None:
    planned = plan(catalog, settings, resources={"memory": "64Mi", "ephemeralStorage": "1Gi"})
    pod = builders.build_pod(
        namespace="ns", execution_name="x", uid=UID, plan=planned, settings=settings
    )
    assert pod["spec"]["volumes"][1]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}


def test_deny_all_network_policy() -> None:
    policy = builders.build_network_policy("ns")
    assert policy["metadata"]["name"] == DENY_ALL_POLICY_NAME
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"sandpod.dev/role": "sandbox"}},
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
        "egress": [],
    }


def egress_policy(settings: OperatorSettings, network: Network) -> Manifest | None:
    return builders.build_egress_policy(
        namespace="ns", execution_name="x", uid=UID, network=network, bounds=settings.egress_bounds
    )


def test_egress_policy_only_for_allowlists(settings: OperatorSettings) -> None:
    assert egress_policy(settings, spec().network) is None
    network = spec(
        network={
            "egress": "allowlist",
            "allow": [
                {"cidr": "8.8.8.0/24", "ports": [{"port": 443}]},
                {"cidr": "2a00:1450::/32"},
            ],
        }
    ).network
    policy = egress_policy(settings, network)
    assert policy is not None
    assert policy["spec"]["podSelector"]["matchLabels"]["sandpod.dev/execution"] == "x"
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["egress"] == [
        {
            "to": [{"ipBlock": {"cidr": "8.8.8.0/24"}}],
            "ports": [{"port": 443, "protocol": "TCP"}],
        },
        {"to": [{"ipBlock": {"cidr": "2a00:1450::/32"}}]},
    ]


def test_egress_blocks_leave_out_the_excluded_ranges_inside_them() -> None:
    settings = OperatorSettings(
        egress_pod_cidrs=["8.8.0.0/24"], egress_open_cidrs=["100.64.0.0/10"]
    )
    network = spec(
        network={"egress": "allowlist", "allow": [{"cidr": "8.0.0.0/8"}, {"cidr": "100.64.0.0/10"}]}
    ).network
    policy = egress_policy(settings, network)
    assert policy is not None
    assert [rule["to"][0]["ipBlock"] for rule in policy["spec"]["egress"]] == [
        {"cidr": "8.0.0.0/8", "except": ["8.8.0.0/24"]},
        # Opened by the administrator: nothing left out.
        {"cidr": "100.64.0.0/10"},
    ]
