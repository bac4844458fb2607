"""The runtimes on the cluster, with the real images and the chart's catalog: each language
reports the version the catalog names; TypeScript that does not type-check still runs, and
lint mode says why (tsc's findings as diagnostics, through kubectl and the gateway).
Go's newer library and language, and C#'s top-level statements: test_compiled_languages.py.
"""

from __future__ import annotations

import httpx
import pytest
from chart_release import DeployedGateway
from executions import create, status, wait_for
from kubernetes import client
from sandpod_contract.catalog import load_catalog

pytestmark = pytest.mark.usefixtures("sandpod_operator")

CATALOG = load_catalog()

# Each prints the version of what runs it, as the catalog spells it (a prefix of it).
VERSION_PROGRAMS = {
    "python": 'import sys\nprint("%d.%d.%d" % sys.version_info[:3])\n',
    "javascript": "console.log(process.versions.node);\n",
    # The TypeScript version is the checker's (lint mode); the program runs on Node.
    "typescript": 'import { execFileSync } from "node:child_process";\n'
    'const version: string = execFileSync("tsc", ["--version"], { encoding: "utf8" });\n'
    'console.log(version.replace("Version ", "").trim());\n',
    "bash": 'echo "${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}.${BASH_VERSINFO[2]}"\n',
    "go": 'package main\n\nimport (\n\t"fmt"\n\t"runtime"\n\t"strings"\n)\n\n'
    'func main() { fmt.Println(strings.TrimPrefix(runtime.Version(), "go")) }\n',
    # C# 7.2 (in parameters, readonly structs) is what mcs compiles: the program says 7.2
    # only if it built.
    "csharp": 'Console.WriteLine($"{Get(new V(7))}.{Get(new V(2))}");\n'
    "static int Get(in V v) => v.X;\n"
    "readonly struct V { public readonly int X; public V(int x) { X = x; } }\n",
}


def test_every_language_has_a_version_program() -> None:
    assert set(VERSION_PROGRAMS) == set(CATALOG.languages)


@pytest.mark.parametrize("language", sorted(VERSION_PROGRAMS))
def test_each_language_runs_the_version_the_catalog_names(
    namespace: str, custom_objects: client.CustomObjectsApi, language: str
) -> None:
    create(
        custom_objects,
        namespace,
        "version",
        language=language,
        source=VERSION_PROGRAMS[language],
        timeoutSeconds=60,
    )
    st = status(wait_for(custom_objects, namespace, "version"))
    assert (st["phase"], st.get("exitCode")) == ("Succeeded", 0), st
    reported = st["stdout"].strip()
    expected = CATALOG.languages[language].version
    assert reported == expected or reported.startswith(f"{expected}."), (reported, expected)


# `answer` is a string at run time whatever its annotation says: Node strips the types.
NOT_TYPE_CHECKED = 'const answer: number = "forty-two";\nconsole.log(answer);\n'


def test_typescript_with_a_type_error_runs_and_lint_reports_it(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    create(custom_objects, namespace, "runs", language="typescript", source=NOT_TYPE_CHECKED)
    create(
        custom_objects,
        namespace,
        "lint",
        language="typescript",
        source=NOT_TYPE_CHECKED,
        mode="lint",
    )
    ran = status(wait_for(custom_objects, namespace, "runs"))
    linted = status(wait_for(custom_objects, namespace, "lint"))

    assert (ran["phase"], ran["stdout"], ran["stderr"]) == ("Succeeded", "forty-two\n", ""), ran
    assert linted["phase"] == "Succeeded", linted
    assert [(d["code"], d["line"], d["column"]) for d in linted["diagnostics"]] == [
        ("TS2322", 1, 7)
    ]
    assert "not assignable to type 'number'" in linted["diagnostics"][0]["message"]


def test_typescript_enums_and_top_level_await_run(
    namespace: str, custom_objects: client.CustomObjectsApi
) -> None:
    source = (
        "enum Color { Red = 1, Green }\n"
        "const wait = (ms: number): Promise<number> =>\n"
        "  new Promise((ok) => setTimeout(() => ok(ms), ms));\n"
        "console.log(Color.Green, await wait(5));\n"
    )
    create(custom_objects, namespace, "enum", language="typescript", source=source)
    st = status(wait_for(custom_objects, namespace, "enum"))
    assert (st["phase"], st["stdout"], st["stderr"]) == ("Succeeded", "2 5\n", ""), st


@pytest.fixture
def agent(gateway: DeployedGateway, namespace: str) -> httpx.Client:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=60, maxConcurrent=2)
    return gateway.client(key)


def test_typescript_lint_through_the_gateway(agent: httpx.Client) -> None:
    request = {"language": "typescript", "code": NOT_TYPE_CHECKED, "mode": "lint"}
    with agent:
        languages = {item["name"]: item for item in agent.get("/v1/languages").json()["languages"]}
        linted = agent.post("/v1/executions", json=request)

    assert languages["typescript"]["lint"] is True
    assert linted.status_code == 200, linted.text
    diagnostics = linted.json()["diagnostics"]
    assert [(d["code"], d["line"], d["column"]) for d in diagnostics] == [("TS2322", 1, 7)]
