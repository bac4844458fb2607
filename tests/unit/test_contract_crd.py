from pathlib import Path
from typing import Any

import pytest
import yaml
from sandpod_contract import crd
from sandpod_testkit.paths import CRD_PATH, CRDS_DIR, POOL_CRD_PATH

COMMITTED = CRD_PATH


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, child in node.get("properties", {}).items():
            found.extend(walk(child, f"{path}.{key}"))
        if "items" in node:
            found.extend(walk(node["items"], f"{path}[]"))
        if isinstance(node.get("additionalProperties"), dict):
            found.extend(walk(node["additionalProperties"], f"{path}{{}}"))
    return found


@pytest.fixture(scope="module")
def generated() -> dict[str, Any]:
    return crd.build_crd()


def schema_of(generated: dict[str, Any]) -> dict[str, Any]:
    return dict(generated["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="module")
def schema(generated: dict[str, Any]) -> dict[str, Any]:
    return schema_of(generated)


@pytest.fixture(scope="module", params=crd.KINDS, ids=lambda kind: kind.kind)
def any_schema(request: pytest.FixtureRequest) -> dict[str, Any]:
    return schema_of(crd.build_crd(request.param))


def test_committed_crd_matches_the_models() -> None:
    assert COMMITTED.read_text() == crd.render(), (
        "crds/ drifted from models.py: run `python -m sandpod_contract.crd`"
    )
    assert POOL_CRD_PATH.read_text() == crd.render(crd.SANDBOX_POOL)
    assert crd.main(["--check", "--output", str(CRDS_DIR)]) == 0
    assert crd.main(["--check", "--chart"]) == 0, (
        "the Helm chart's copy drifted: run `python -m sandpod_contract.crd --chart`"
    )


def test_check_reports_drift(tmp_path: Path) -> None:
    stale = tmp_path / "codeexecutions.sandpod.dev.yaml"
    stale.write_text("old\n")
    assert crd.main(["--check", "--output", str(tmp_path)]) == 1
    assert crd.main(["--output", str(tmp_path)]) == 0
    assert crd.main(["--check", "--output", str(tmp_path)]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "codeexecutions.sandpod.dev.yaml",
        "codesessions.sandpod.dev.yaml",
        "sandboxpools.sandpod.dev.yaml",
    ]


def test_schema_is_structural(any_schema: dict[str, Any]) -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const"}
    for path, node in walk(any_schema):
        assert not forbidden & set(node), f"{path}: {forbidden & set(node)}"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path}: untyped"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node
        if "properties" in node:
            assert "additionalProperties" not in node, path
            assert set(node.get("required", [])) <= set(node["properties"]), path
        assert node.get("default", "absent") is not None, f"{path}: null default"


def test_every_property_is_described(any_schema: dict[str, Any]) -> None:
    assert crd.undescribed_properties(any_schema) == []
    for path, node in walk(any_schema):
        if path.count(".") >= 1 and not path.endswith("[]") and path != ".metadata":
            assert node.get("description"), path


def test_translation_refuses_unions() -> None:
    with pytest.raises(crd.SchemaError, match="union"):
        crd.structural({"anyOf": [{"type": "string"}, {"type": "integer"}]}, {}, "x")
    with pytest.raises(crd.SchemaError, match="exclusiveMinimum"):
        crd.structural({"type": "integer", "exclusiveMinimum": 0}, {}, "x")


def test_cel_rules(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    rules = {r["message"]: r["rule"] for r in spec["x-kubernetes-validations"]}
    assert rules["spec is immutable"] == "self == oldSelf"
    assert any("files.map" in rule for rule in rules.values())
    root_rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("self.metadata.name" in rule for rule in root_rules)
    cpu = spec["properties"]["resources"]["properties"]["cpu"]
    assert "quantity(" in cpu["x-kubernetes-validations"][0]["rule"]
    network = spec["properties"]["network"]
    assert "allowlist" in network["x-kubernetes-validations"][0]["rule"]


def test_bounds_are_in_the_schema(schema: dict[str, Any]) -> None:
    props = schema["properties"]["spec"]["properties"]
    timeout = props["timeoutSeconds"]
    assert (timeout["minimum"], timeout["maximum"], timeout["default"]) == (1, 300, 10)
    assert props["maxOutputBytes"]["maximum"] == 8 * 1024 * 1024
    assert props["ttlSecondsAfterFinished"]["maximum"] == 604800
    assert props["source"]["maxLength"] == 256 * 1024
    assert props["files"]["maxItems"] == 32
    assert props["files"]["x-kubernetes-list-map-keys"] == ["path"]
    assert props["mode"]["enum"] == ["run", "lint"]
    status = schema["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert status["startedAt"]["format"] == "date-time"


def test_names_columns_and_subresources(generated: dict[str, Any]) -> None:
    spec = generated["spec"]
    assert generated["metadata"]["name"] == "codeexecutions.sandpod.dev"
    assert spec["names"]["shortNames"] == ["cx"]
    assert spec["names"]["categories"] == ["sandpod"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Language"] == ".spec.language"
    assert columns["Phase"] == ".status.phase"
    assert columns["Exit"] == ".status.exitCode"
    assert columns["Duration(ms)"] == ".status.durationMs"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_yaml_is_lean_and_loads() -> None:
    text = COMMITTED.read_text()
    assert len(text) < 64 * 1024
    assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


def named_crd(kind: crd.Kind, crd_name: str, kind_name: str, short_names: list[str]) -> Any:
    """The kind's generated CRD, once its names are checked."""
    generated = crd.build_crd(kind)
    assert generated["metadata"]["name"] == crd_name
    names = generated["spec"]["names"]
    assert (names["kind"], names["shortNames"]) == (kind_name, short_names)
    return generated


def printer_columns(generated: Any, *, wide: bool) -> list[str]:
    """The names of the columns kubectl get shows (with -o wide: all of them)."""
    columns = generated["spec"]["versions"][0]["additionalPrinterColumns"]
    return [c["name"] for c in columns if wide or "priority" not in c]


def test_pool_schema_names_and_columns() -> None:
    generated = named_crd(crd.SANDBOX_POOL, "sandboxpools.sandpod.dev", "SandboxPool", ["sbp"])
    assert printer_columns(generated, wide=True) == ["Language", "Ready", "Total", "Size", "Age"]
    schema = schema_of(generated)
    spec = schema["properties"]["spec"]
    # Mutable: size scales the pool.
    assert "x-kubernetes-validations" not in spec
    assert spec["required"] == ["language", "size"]
    size = spec["properties"]["size"]
    assert (size["minimum"], size["maximum"]) == (0, 50)
    assert spec["properties"]["maxRefillPerMinute"]["minimum"] == 1
    cpu = spec["properties"]["resources"]["properties"]["cpu"]
    assert "quantity(" in cpu["x-kubernetes-validations"][0]["rule"]
    root_rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("self.metadata.name" in rule for rule in root_rules)


def test_session_schema_names_columns_and_immutable_spec() -> None:
    generated = named_crd(crd.CODE_SESSION, "codesessions.sandpod.dev", "CodeSession", ["cxs"])
    columns = printer_columns(generated, wide=False)
    assert columns == ["Language", "Phase", "Executions", "Expires", "Age"]
    spec = schema_of(generated)["properties"]["spec"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    idle = spec["properties"]["idleTimeoutSeconds"]
    lifetime = spec["properties"]["maxLifetimeSeconds"]
    assert (idle["default"], idle["minimum"], idle["maximum"]) == (600, 10, 86400)
    assert (lifetime["default"], lifetime["minimum"], lifetime["maximum"]) == (3600, 60, 86400)
    status = schema_of(generated)["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Starting", "Ready", "Busy", "Ended"]


def test_executions_name_a_session_and_report_its_result() -> None:
    schema = schema_of(crd.build_crd(crd.CODE_EXECUTION))
    assert "session" in schema["properties"]["spec"]["properties"]
    status = schema["properties"]["status"]["properties"]
    assert {"session", "result", "stateLost"} <= set(status)
    assert status["reportedBy"]["enum"] == ["runner", "sessionKernel"]
