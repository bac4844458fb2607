"""Generate sandpod's CustomResourceDefinitions (CodeExecution, SandboxPool, CodeSession) from
the models.

    python -m sandpod_contract.crd            # write crds/<plural>.sandpod.dev.yaml, one per kind
    python -m sandpod_contract.crd --check    # exit 1 when a committed file differs
    python -m sandpod_contract.crd --chart    # the Helm chart's copy (charts/sandpod), same options

Pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema: every
node typed (or marked int-or-string), no $ref, no anyOf/oneOf for optional values, no
additionalProperties next to properties, a description on every property.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from sandpod_contract.generated_files import write_or_check
from sandpod_contract.models import (
    NAME_RULE,
    CodeExecutionSpec,
    CodeExecutionStatus,
    CodeSessionSpec,
    CodeSessionStatus,
    SandboxPoolSpec,
    SandboxPoolStatus,
)
from sandpod_contract.names import (
    CATEGORIES,
    EXECUTION_NAMES,
    GROUP,
    POOL_NAMES,
    SESSION_NAMES,
    VERSION,
)

Schema = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One custom resource: its names, models and how kubectl get shows it."""

    names: tuple[str, str, str, tuple[str, ...]]  # kind, plural, singular, short names
    description: str
    models: tuple[type[BaseModel], type[BaseModel]]  # spec, status
    # Printer columns between Language (first) and Age (last), which every kind shows.
    columns: tuple[Schema, ...]

    @property
    def kind(self) -> str:
        return self.names[0]

    @property
    def crd_name(self) -> str:
        return f"{self.names[1]}.{GROUP}"


def column(name: str, kind: str, path: str, description: str = "", priority: int = 0) -> Schema:
    """A printer column; priority 1 shows it only with kubectl get -o wide."""
    printed: Schema = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        printed["priority"] = priority
    if description:
        printed["description"] = description
    return printed


def phase_columns(*middle: Schema) -> tuple[Schema, ...]:
    """Phase and Reason, then the kind's own columns, then its Pod (wide)."""
    return (
        column("Phase", "string", ".status.phase"),
        column("Reason", "string", ".status.reason", priority=1),
        *middle,
        column("Pod", "string", ".status.podName", priority=1),
    )


LANGUAGE_COLUMN = column("Language", "string", ".spec.language")
AGE_COLUMN = column("Age", "date", ".metadata.creationTimestamp")
EXECUTION_DESCRIPTION = (
    "CodeExecution runs one program in a short-lived, locked-down sandbox pod (gVisor) and "
    "records its result in status."
)
POOL_DESCRIPTION = (
    "SandboxPool keeps `size` sandbox pods of one language started and free, so that an "
    "execution that fits the pool claims one instead of starting a pod."
)
SESSION_DESCRIPTION = (
    "CodeSession keeps one sandbox for one user: CodeExecutions that name it run there one "
    "at a time, keeping its files and (Python) its interpreter's state, until it idles out, "
    "reaches its lifetime or is deleted."
)
CODE_EXECUTION = Kind(
    names=EXECUTION_NAMES,
    description=EXECUTION_DESCRIPTION,
    models=(CodeExecutionSpec, CodeExecutionStatus),
    columns=phase_columns(
        column("Exit", "integer", ".status.exitCode"),
        column(
            "Duration(ms)",
            "integer",
            ".status.durationMs",
            "Run time of the program in milliseconds.",
        ),
    ),
)
SANDBOX_POOL = Kind(
    names=POOL_NAMES,
    description=POOL_DESCRIPTION,
    models=(SandboxPoolSpec, SandboxPoolStatus),
    columns=(
        column("Ready", "integer", ".status.ready", "Free pods ready to be claimed."),
        column("Total", "integer", ".status.total", "Free pods, ready or starting."),
        column("Size", "integer", ".spec.size"),
    ),
)
CODE_SESSION = Kind(
    names=SESSION_NAMES,
    description=SESSION_DESCRIPTION,
    models=(CodeSessionSpec, CodeSessionStatus),
    columns=phase_columns(
        column("Executions", "integer", ".status.executionCount", "Executions run in the session."),
        column("Expires", "date", ".status.expiresAt"),
    ),
)
KINDS = (CODE_EXECUTION, SANDBOX_POOL, CODE_SESSION)

CRD_NAME = CODE_EXECUTION.crd_name
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO_ROOT / "crds"
CHART_OUTPUT = REPO_ROOT / "charts" / "sandpod" / "templates" / "crd.yaml"

# JSON Schema keywords that carry over to Kubernetes' OpenAPI v3 subset unchanged.
_KEPT = (
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)
_DROPPED = ("title", "examples", "$defs")


class SchemaError(ValueError):
    """The pydantic schema uses something that has no structural equivalent."""


def structural(schema: Schema, defs: Schema, where: str = "") -> Schema:
    """Translate one pydantic JSON Schema node (and its children) to a structural schema."""
    node = dict(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}  # the referencing field's description wins
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        if len(variants) != 1:
            raise SchemaError(f"{where}: a union other than Optional[X] is not structural")
        node = {**variants[0], **node}
        if node.get("default", ...) is None:
            del node["default"]  # absent means None; null would be pruned anyway
        return structural(node, defs, where)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for keyword in ("oneOf", "allOf", "not", "exclusiveMinimum", "exclusiveMaximum"):
        if keyword in node:
            raise SchemaError(f"{where}: {keyword} has no structural equivalent here")
    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        node.pop("pattern", None)  # validated by CEL, which sees ints and strings alike

    result: Schema = {k: node[k] for k in _KEPT if k in node}
    unknown = set(node) - set(_KEPT) - set(_DROPPED) - {"properties", "required", "items"}
    unknown -= {"additionalProperties"}
    if unknown:
        raise SchemaError(f"{where}: unsupported keywords {sorted(unknown)}")

    if node.get("type") == "object":
        properties = node.get("properties")
        if properties:
            result["properties"] = {
                name: structural(child, defs, f"{where}.{name}")
                for name, child in properties.items()
            }
            if node.get("required"):
                result["required"] = list(node["required"])
        elif isinstance(node.get("additionalProperties"), dict):
            result["additionalProperties"] = structural(
                node["additionalProperties"], defs, f"{where}[*]"
            )
    if node.get("type") == "array":
        result["items"] = structural(node["items"], defs, f"{where}[]")
    return result


def model_schema(model: type[Any]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}), model.__name__)


def undescribed_properties(schema: Schema, where: str = "") -> list[str]:
    """Paths of properties without a description (kubectl explain would show nothing)."""
    missing: list[str] = []
    for name, child in schema.get("properties", {}).items():
        path = f"{where}.{name}"
        if path == ".metadata":
            continue
        if not child.get("description"):
            missing.append(path)
        missing.extend(undescribed_properties(child, path))
    if "items" in schema:
        missing.extend(undescribed_properties(schema["items"], f"{where}[]"))
    return missing


def build_crd(kind: Kind = CODE_EXECUTION) -> Schema:
    root: Schema = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "x-kubernetes-validations": [NAME_RULE],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this object.",
            },
            "kind": {
                "type": "string",
                "description": "Kind is the REST resource this object represents.",
            },
            # The API server documents metadata itself and allows nothing more here.
            "metadata": {"type": "object"},
            "spec": model_schema(kind.models[0]),
            "status": model_schema(kind.models[1]),
        },
    }
    missing = undescribed_properties(root)
    if missing:
        raise SchemaError(f"properties without a description: {', '.join(missing)}")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {"app.kubernetes.io/name": "sandpod", "app.kubernetes.io/part-of": "sandpod"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": _names(*kind.names),
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        dict(column) for column in (LANGUAGE_COLUMN, *kind.columns, AGE_COLUMN)
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def _names(kind: str, plural: str, singular: str, short_names: tuple[str, ...]) -> Schema:
    return {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": singular,
        "shortNames": list(short_names),
        "categories": list(CATEGORIES),
    }


def _header(command: str) -> str:
    return (
        f"# Generated by `{command}` from contract/sandpod_contract/"
        "models.py.\n# Do not edit: change the models and regenerate.\n"
    )


def _dump(data: Schema) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)


def render(kind: Kind = CODE_EXECUTION) -> str:
    return _header("python -m sandpod_contract.crd") + _dump(build_crd(kind))


# Installed only with crds.enabled; `helm uninstall` leaves them (and so every execution and
# pool in the cluster) in place with crds.keep.
_CHART_ANNOTATIONS = """\
  {{- if .Values.crds.keep }}
  annotations:
    helm.sh/resource-policy: keep
  {{- end }}
"""


def _chart_document(kind: Kind) -> str:
    crd = build_crd(kind)
    head = _dump({key: crd[key] for key in ("apiVersion", "kind", "metadata")})
    spec = _dump({"spec": crd["spec"]})
    if "{{" in spec:
        raise SchemaError("the CRD contains '{{', which Helm would read as a template action")
    return "---\n" + head + _CHART_ANNOTATIONS + spec


def render_chart_template() -> str:
    """The same CRDs as one template of the Helm chart (charts/sandpod/templates/crd.yaml)."""
    return (
        "{{- if .Values.crds.enabled }}\n"
        + _header("python -m sandpod_contract.crd --chart")
        + "".join(_chart_document(kind) for kind in KINDS)
        + "{{- end }}\n"
    )


def outputs(*, chart: bool, output: Path | None) -> dict[Path, str]:
    """What to write where: the chart's template, or one file per kind in a directory."""
    if chart:
        return {output or CHART_OUTPUT: render_chart_template()}
    directory = output or DEFAULT_OUTPUT
    return {directory / f"{kind.crd_name}.yaml": render(kind) for kind in KINDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Generate sandpod's CRDs ({GROUP}/{VERSION}).")
    parser.add_argument(
        "--output",
        type=Path,
        help=f"directory (default: {DEFAULT_OUTPUT}); with --chart, the file",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument(
        "--chart",
        action="store_true",
        help=f"the Helm chart's template (default output: {CHART_OUTPUT})",
    )
    args = parser.parse_args(argv)
    files = outputs(chart=args.chart, output=args.output)
    command = "python -m sandpod_contract.crd" + (" --chart" if args.chart else "")
    return write_or_check(files, check=args.check, command=command)


if __name__ == "__main__":
    sys.exit(main())
