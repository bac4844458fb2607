"""Compiled languages (go, csharp) end to end on the cluster, with the real images: hello
world and a compile error, through kubectl and through the gateway; Go's newer library and
language; C# written as top-level statements; the gateway's language list and tool enum name
them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_release import DeployedGateway
from executions import kubectl, wait_for
from kubernetes import client
from sandpod_testkit.kube import ensure_crd

pytestmark = pytest.mark.usefixtures("sandpod_operator")


@pytest.fixture(autouse=True)
def this_crd(api_client: client.ApiClient) -> None:
    """This checkout's CRD, again: on a cluster shared with other checkouts, a CRD without
    compileOutput may have replaced it since the session began (its status would be pruned)."""
    ensure_crd(api_client)


HELLO = {
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello from go")\n}\n',
    "csharp": "using System;\n\nclass Hello {\n    static void Main() {\n"
    '        Console.WriteLine("hello from csharp");\n    }\n}\n',
}
BROKEN = {
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Printn("never")\n}\n',
    "csharp": "class Broken {\n    static void Main() {\n"
    '        System.Console.WriteLin("never");\n    }\n}\n',
}
# What each compiler says about BROKEN (it names the missing member).
COMPILER_SAYS = {"go": "undefined: fmt.Printn", "csharp": "error CS0117"}


def kubectl_run(
    kubeconfig: Path,
    objects: client.CustomObjectsApi,
    namespace: str,
    name: str,
    language: str,
    source: str,
) -> Any:
    """`kubectl apply` of a CodeExecution, a wait until it ended, its status by `kubectl get`."""
    manifest = {
        "apiVersion": "sandpod.dev/v1alpha1",
        "kind": "CodeExecution",
        "metadata": {"name": name},
        "spec": {"language": language, "source": source, "timeoutSeconds": 60},
    }
    ns = f"--namespace={namespace}"
    applied = kubectl(kubeconfig, ns, "apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert applied.returncode == 0, applied.stderr
    wait_for(objects, namespace, name)
    got = kubectl(kubeconfig, ns, "get", f"cx/{name}", "-o", "json")
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["status"]


@pytest.mark.parametrize("language", sorted(HELLO))
def test_hello_world_through_kubectl(
    kubeconfig_path: Path, custom_objects: client.CustomObjectsApi, namespace: str, language: str
) -> None:
    st = kubectl_run(kubeconfig_path, custom_objects, namespace, "hello", language, HELLO[language])
    assert (st["phase"], st["reason"], st["exitCode"]) == ("Succeeded", "Completed", 0), st
    assert st["stdout"] == f"hello from {language}\n"
    assert st["stderr"] == ""
    assert st["compileOutput"] == "" and st["compileOutputTruncated"] is False


@pytest.mark.parametrize("language", sorted(BROKEN))
def test_a_compile_error_through_kubectl(
    kubeconfig_path: Path, custom_objects: client.CustomObjectsApi, namespace: str, language: str
) -> None:
    st = kubectl_run(
        kubeconfig_path, custom_objects, namespace, "broken", language, BROKEN[language]
    )
    assert (st["phase"], st["reason"]) == ("Failed", "CompilationError"), st
    assert st["message"].startswith("the program did not build (compiler exit ")
    assert COMPILER_SAYS[language] in st["compileOutput"]
    assert "exitCode" not in st
    assert st["stdout"] == "" and st["stderr"] == ""
    assert st["retryable"] is False


# Go 1.21's slices and min, 1.22's range over an int and per-iteration loop variables.
MODERN_GO = (
    'package main\n\nimport (\n\t"fmt"\n\t"slices"\n)\n\nfunc main() {\n'
    "\tvar got []func() int\n"
    "\tfor i := range 3 {\n\t\tgot = append(got, func() int { return i })\n\t}\n"
    "\tfmt.Println(slices.Max([]int{3, 9, 4}), min(2, 1), got[0](), got[2]())\n}\n"
)


def test_go_has_a_current_library_and_language(
    kubeconfig_path: Path, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    st = kubectl_run(kubeconfig_path, custom_objects, namespace, "modern", "go", MODERN_GO)
    assert (st["phase"], st["exitCode"]) == ("Succeeded", 0), st
    assert st["stdout"] == "9 1 0 2\n"


# What a "Run C#" pad receives: no class, no Main, no usings for System or LINQ; a function
# and a type after the statements; the program's exit code from a top-level return.
TOP_LEVEL_CSHARP = (
    "using System.Text;\n\n"
    "var words = new StringBuilder();\n"
    'foreach (var word in new List<string> { "top", "level" }.Select(Shout)) words.Append(word);\n'
    'Console.WriteLine($"{words} {new Point { X = 3 }.X}");\n'
    "return 3;\n\n"
    'static string Shout(string word) => word.ToUpper() + "!";\n\n'
    "class Point { public int X; }\n"
)
# A type error on line 2, column 9: the compiler names the user's file, line and column.
TOP_LEVEL_CSHARP_BROKEN = 'Console.WriteLine("never");\nint n = "seven";\n'


def test_csharp_top_level_statements(
    kubeconfig_path: Path, custom_objects: client.CustomObjectsApi, namespace: str
) -> None:
    ran = kubectl_run(
        kubeconfig_path, custom_objects, namespace, "top-level", "csharp", TOP_LEVEL_CSHARP
    )
    broken = kubectl_run(
        kubeconfig_path, custom_objects, namespace, "top-broken", "csharp", TOP_LEVEL_CSHARP_BROKEN
    )

    assert (ran["phase"], ran["reason"], ran["exitCode"]) == ("Failed", "NonZeroExit", 3), ran
    assert ran["stdout"] == "TOP!LEVEL! 3\n"
    assert ran["compileOutput"] == ""
    assert (broken["phase"], broken["reason"]) == ("Failed", "CompilationError"), broken
    assert "main.cs(2,9): error CS0029" in broken["compileOutput"]


@pytest.fixture
def agent(gateway: DeployedGateway, namespace: str) -> httpx.Client:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=120, maxConcurrent=2)
    return gateway.client(key)


@pytest.mark.parametrize("language", sorted(HELLO))
def test_hello_world_and_a_compile_error_through_the_gateway(
    agent: httpx.Client, language: str
) -> None:
    with agent:
        hello = agent.post("/v1/executions", json={"language": language, "code": HELLO[language]})
        broken = agent.post("/v1/executions", json={"language": language, "code": BROKEN[language]})

    assert hello.status_code == 200, hello.text
    assert hello.json()["status"] == "success"
    assert hello.json()["stdout"] == f"hello from {language}\n"
    assert hello.json()["compile_output"] == ""
    assert broken.status_code == 200, broken.text
    result = broken.json()
    assert result["status"] == "compile_error", result
    assert result["reason"] == "CompilationError"
    assert COMPILER_SAYS[language] in result["compile_output"]
    assert result["error_message"].startswith("the program did not build")
    assert result["stdout"] == "" and result["exit_code"] is None


def test_the_gateway_offers_the_compiled_languages(agent: httpx.Client) -> None:
    with agent:
        languages = agent.get("/v1/languages").json()["languages"]
        tools = agent.get("/v1/tools/openai").json()

    compiled = {item["name"] for item in languages if item["compiled"]}
    assert compiled == {"csharp", "go"}
    run_code = next(t for t in tools if t["function"]["name"] == "run_code")
    enum = run_code["function"]["parameters"]["properties"]["language"]["enum"]
    assert {"csharp", "go"} <= set(enum)
    assert enum == sorted(item["name"] for item in languages)
