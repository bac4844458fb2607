"""Egress by host name through the chart's egress proxy, against a fake internet on this machine.

The proxy is the chart's own, of a release this module installs (its operator watches the
module's tenant namespaces). Its names come from hostAliases (never DNS): allowed.fake,
pypi.fake and npm.fake are the fake web host (a package index and an npm registry too),
other.fake a second one, metadata.fake the metadata address and cluster.fake the cluster's API
Service address. Web hosts live in the fake internet's network namespace
(fake_hosts.FAKE_INTERNET); nothing leaves the machine.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import hashlib
import io
import json
import subprocess
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_release import ChartRelease, installed
from cluster_fixtures import ReleaseFactory
from executions import create, events_about, status, wait_for
from fake_hosts import (
    FAKE_INTERNET,
    HTTP_PORT,
    HTTPS_PORT,
    METADATA_ADDRESS,
    OTHER_WEB_ADDRESS,
    WEB_ADDRESS,
    WEB_SERVER,
    FakeHosts,
)
from kubernetes import client
from proxy_latency import execution_spec, measure, report
from release_settings import narrowed_tenant
from sandpod_contract.names import SESSION_PLURAL
from sandpod_testkit.kube import (
    GROUP,
    LOCAL_POD_CIDR,
    VERSION,
    create_namespace,
    delete_executions,
    is_gone,
)
from sandpod_testkit.waiting import wait_until
from test_sessions import open_session, session_of

PACKAGE = "sandpodfake"
PACKAGE_VALUE = "installed through the egress proxy"
NPM_PACKAGE = "sandpod-fake-npm"
CLUSTER_SERVICE_ADDRESS = "10.96.0.1"  # the local cluster's `kubernetes` Service
HOST_ALIASES = [
    {"ip": WEB_ADDRESS, "hostnames": ["allowed.fake", "pypi.fake", "npm.fake"]},
    {"ip": OTHER_WEB_ADDRESS, "hostnames": ["other.fake"]},
    {"ip": METADATA_ADDRESS, "hostnames": ["metadata.fake"]},
    {"ip": CLUSTER_SERVICE_ADDRESS, "hostnames": ["cluster.fake"]},
]

# The start of the programs below: `fetch(through, url)` answers [status, the body's start] or
# ["refused", why]; `context` is HTTPS that does not verify the fake hosts' self-signed
# certificates.
FETCHING = """
import json, os, socket, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
def fetch(through, url):
    try:
        with through.open(url, timeout=15) as answer:
            return [answer.status, answer.read().decode()[:60]]
    except urllib.error.HTTPError as error:
        return [error.code, ""]
    except OSError as error:
        return ["refused", str(error)[:80]]
"""

# Fetches each URL through the proxy (urllib reads HTTP(S)_PROXY) and tries one direct
# connection; prints JSON.
FETCH = (
    FETCHING
    + """
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
results = {url: fetch(opener, url) for url in sys.argv[1:]}
try:
    socket.create_connection(("%(web)s", %(port)d), timeout=3).close()
    results["direct"] = "connected"
except OSError as error:
    results["direct"] = type(error).__name__
print(json.dumps(results))
"""
)

INSTALL = """
import subprocess, sys
pip = [sys.executable, "-m", "pip", "install", "--user", "--disable-pip-version-check",
       "--index-url", "http://pypi.fake:%(port)d/simple/", "--trusted-host", "pypi.fake",
       "%(package)s"]
installed = subprocess.run(pip, capture_output=True, text=True)
print("pip exit", installed.returncode, installed.stderr[-400:])
# The user site did not exist when this interpreter started: import it in a new one.
imported = subprocess.run([sys.executable, "-c", "import %(package)s; print(%(package)s.VALUE)"],
                          capture_output=True, text=True)
print(imported.stdout.strip(), imported.stderr[-400:])
"""


def wheel(directory: Path) -> str:
    """A minimal pure-Python wheel of PACKAGE in `directory`; its file name."""
    files = {
        f"{PACKAGE}/__init__.py": f"VALUE = {PACKAGE_VALUE!r}\n",
        f"{PACKAGE}-1.0.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {PACKAGE}\nVersion: 1.0\n",
        f"{PACKAGE}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: sandpod-tests\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{PACKAGE}-1.0.dist-info/RECORD"] = (
        "\n".join([*record, f"{PACKAGE}-1.0.dist-info/RECORD,,"]) + "\n"
    )
    name = f"{PACKAGE}-1.0-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    (directory / name).write_bytes(buffer.getvalue())
    return name


# npm installs NPM_PACKAGE from the fake registry (npm reads npm_config_proxy) into the work
# directory (HOME, where npm keeps its cache too), then a new node requires it.
NPM_INSTALL = """
const { spawnSync } = require("child_process");
const npm = spawnSync("npm", ["install", "--no-audit", "--no-fund", "--registry",
                              "http://npm.fake:%(port)d/", "%(package)s"], { encoding: "utf8" });
console.log("npm exit", npm.status, (npm.stderr || "").slice(-400));
const node = spawnSync("node", ["-e", "console.log(require('%(package)s').value)"],
                       { encoding: "utf8" });
console.log(node.stdout.trim(), (node.stderr || "").slice(-400));
"""

# Over the proxy with the execution's own credentials: CONNECT to allowed.fake, then TLS with
# another server name, without one, and (the control) with allowed.fake's; prints JSON.
FRONTING = """
import base64, json, os, socket, ssl, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
credentials = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
def tunnel(server_name):
    raw = socket.create_connection((proxy.hostname, proxy.port), timeout=15)
    raw.sendall(b"CONNECT allowed.fake:%(port)d HTTP/1.1\\r\\nHost: allowed.fake:%(port)d\\r\\n"
                + f"Proxy-Authorization: Basic {credentials}\\r\\n\\r\\n".encode())
    head = b""
    while not head.endswith(b"\\r\\n\\r\\n"):
        byte = raw.recv(1)
        if not byte:
            return ["connect closed", head.decode()[:40]]
        head += byte
    status = head.split(b" ")[1].decode()
    try:
        tls = context.wrap_socket(raw, server_hostname=server_name)
    except OSError as error:
        return [status, "refused", type(error).__name__]
    tls.sendall(b"GET /whoami HTTP/1.0\\r\\nHost: allowed.fake\\r\\n\\r\\n")
    answer = b""
    try:
        while chunk := tls.recv(4096):
            answer += chunk
    except ssl.SSLError:
        pass  # the server's close without close_notify
    return [status, answer.decode().splitlines()[-1]]
print(json.dumps({name: tunnel(name) for name in ("other.fake", None, "allowed.fake")}))
"""


def npm_tarball() -> bytes:
    """NPM_PACKAGE 1.0.0 as npm packs it (package/package.json and package/index.js)."""
    files = {
        "package/package.json": json.dumps(
            {"name": NPM_PACKAGE, "version": "1.0.0", "main": "index.js"}
        ),
        "package/index.js": f"module.exports = {{ value: {json.dumps(PACKAGE_VALUE)} }};\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def npm_registry(root: Path) -> None:
    """NPM_PACKAGE's packument at /<name> and its tarball, as a registry serves them."""
    tarball = npm_tarball()
    name = f"{NPM_PACKAGE}-1.0.0.tgz"
    (root / "tarballs").mkdir()
    (root / "tarballs" / name).write_bytes(tarball)
    dist = {
        "tarball": f"http://npm.fake:{HTTP_PORT}/tarballs/{name}",
        "shasum": hashlib.sha1(tarball).hexdigest(),
        "integrity": "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode(),
    }
    version = {"name": NPM_PACKAGE, "version": "1.0.0", "main": "index.js", "dist": dist}
    packument = {
        "name": NPM_PACKAGE,
        "dist-tags": {"latest": "1.0.0"},
        "versions": {"1.0.0": version},
    }
    (root / NPM_PACKAGE).write_text(json.dumps(packument))


def web_root(root: Path) -> None:
    """The fake internet's content: a 1 MB file, a package index with PACKAGE and an npm
    registry with NPM_PACKAGE."""
    (root / "big.bin").write_bytes(b"x" * (1024 * 1024))
    packages = root / "packages"
    packages.mkdir()
    name = wheel(packages)
    digest = hashlib.sha256((packages / name).read_bytes()).hexdigest()
    index = root / "simple" / PACKAGE
    index.mkdir(parents=True)
    link = f'<a href="../../packages/{name}#sha256={digest}">{name}</a>'
    (index / "index.html").write_text(f"<!DOCTYPE html><html><body>{link}</body></html>\n")
    npm_registry(root)


@pytest.fixture(scope="module")
def fake_internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    workdir = tmp_path_factory.mktemp("fake-internet")
    root = workdir / "www"
    root.mkdir()
    web_root(root)
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=allowed.fake", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = (WEB_SERVER, str(root), str(cert), str(key), str(HTTP_PORT), str(HTTPS_PORT))
    hosts = FakeHosts(
        LOCAL_POD_CIDR,
        workdir / "unused.log",
        net=FAKE_INTERNET,
        server=(*server, *FAKE_INTERNET.addresses),
    )
    try:
        hosts.create()
        assert hosts.routed_here(), "pod traffic to the fake internet would leave the machine"
        yield hosts
    finally:
        hosts.remove()
    assert not hosts.leftovers()


@pytest.fixture(scope="module")
def proxy_prefix(namespace_prefix: str) -> str:
    """Outside the session release's namespaces (`<prefix>-*`): this module's release."""
    return f"{namespace_prefix}px"


@pytest.fixture(scope="module")
def tenants(core_v1: client.CoreV1Api, proxy_prefix: str) -> Iterator[dict[str, str]]:
    names = {t: f"{proxy_prefix}-{t}-{uuid.uuid4().hex[:4]}" for t in ("a", "b")}
    for name in names.values():
        create_namespace(core_v1, name)
    yield names
    for name in names.values():
        core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def proxy_operator(
    new_release: ReleaseFactory,
    api_client: client.ApiClient,
    proxy_prefix: str,
    fake_internet: FakeHosts,
    tenants: dict[str, str],
) -> Iterator[ChartRelease]:
    """A release of this module's own: its egress proxy's names are the fake internet's, and
    tenant b may name other.fake only."""
    values = {
        "egressProxy": {"hostAliases": HOST_ALIASES},
        "tenants": [narrowed_tenant(tenants["b"], ["other.fake"])],
    }
    with installed(new_release(proxy_prefix, values)) as release:
        yield release
        # Executions carry the operator's finalizer: delete them while it still runs.
        objects = client.CustomObjectsApi(api_client)
        for namespace in tenants.values():
            delete_executions(objects, namespace, timeout=60)


def run(
    objects: client.CustomObjectsApi,
    namespace: str,
    source: str,
    hosts: list[dict[str, Any]],
    args: list[str] | None = None,
    language: str = "python",
) -> tuple[str, dict[str, Any]]:
    return ran(
        objects,
        namespace,
        f"proxy-{uuid.uuid4().hex[:6]}",
        source,
        args,
        language=language,
        resources={"memory": "512Mi"},
        network={"egress": "allowlist", "allow": hosts},
    )


def ran(
    objects: client.CustomObjectsApi,
    namespace: str,
    name: str,
    source: str,
    args: list[str] | None,
    **spec: Any,
) -> tuple[str, dict[str, Any]]:
    """Execution `name` of `source` with `args` (90 s for its installs and fetches): its name
    and its status once it has ended."""
    create(objects, namespace, name, source=source, args=args or [], timeoutSeconds=90, **spec)
    return name, status(wait_for(objects, namespace, name, timeout=150))


def fetch_source() -> str:
    return FETCH % {"web": WEB_ADDRESS, "port": HTTP_PORT}


def blocked_of(result: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(b["host"], b["port"]): b["count"] for b in result.get("egressBlocked") or []}


def wait_for_blocked_event(core: client.CoreV1Api, namespace: str, name: str) -> None:
    """The execution's EgressBlocked Event: posted (kopf queues Events) after the status write
    that a test sees first."""

    def posted() -> bool:
        events = events_about(core, namespace, "CodeExecution", name)
        return any(e.reason == "EgressBlocked" for e in events)

    wait_until(posted, timeout=30, what=f"an EgressBlocked Event about {name}")


@pytest.mark.usefixtures("proxy_operator")
def test_allowed_hosts_pass_and_everything_else_is_blocked_and_reported(
    custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api, tenants: dict[str, str]
) -> None:
    web = f"allowed.fake:{HTTP_PORT}"
    urls = {
        "http": f"http://{web}/whoami",
        "https": f"https://allowed.fake:{HTTPS_PORT}/whoami",
        "not listed": f"http://other.fake:{HTTP_PORT}/whoami",
        "ip literal": f"http://{WEB_ADDRESS}:{HTTP_PORT}/whoami",
        "metadata": f"http://{METADATA_ADDRESS}/latest/meta-data/",
        "name to metadata": "http://metadata.fake/latest/meta-data/",
        "name to cluster": "https://cluster.fake:443/version",
    }
    hosts = [
        {"host": "allowed.fake", "ports": [{"port": HTTP_PORT}, {"port": HTTPS_PORT}]},
        {"host": "metadata.fake", "ports": [{"port": 80}]},
        {"host": "cluster.fake", "ports": [{"port": 443}]},
    ]
    name, result = run(custom_objects, tenants["a"], fetch_source(), hosts, list(urls.values()))
    assert result["phase"] == "Succeeded", result
    seen = json.loads(result["stdout"])
    answer = f"fake internet {WEB_ADDRESS}"
    assert seen[urls["http"]] == [200, f"{answer}\n"]
    assert seen[urls["https"]] == [200, f"{answer}\n"]
    # A refused CONNECT's 403 comes inside TLS with the proxy's own certificate (Squid on an
    # ssl-bump port); this client does not verify it.
    for case in ("not listed", "ip literal", "metadata", "name to metadata", "name to cluster"):
        assert seen[urls[case]] == [403, ""], case
    assert seen["direct"] != "connected"
    assert blocked_of(result) == {
        ("other.fake", HTTP_PORT): 1,
        (WEB_ADDRESS, HTTP_PORT): 1,
        (METADATA_ADDRESS, 80): 1,
        ("metadata.fake", 80): 1,
        ("cluster.fake", 443): 1,
    }
    wait_for_blocked_event(core_v1, tenants["a"], name)


@pytest.mark.usefixtures("proxy_operator")
def test_two_tenants_at_once_each_reach_only_their_own_hosts(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    urls = [f"http://allowed.fake:{HTTP_PORT}/whoami", f"http://other.fake:{HTTP_PORT}/whoami"]
    allows = {
        "a": [{"host": "allowed.fake", "ports": [{"port": HTTP_PORT}]}],
        "b": [{"host": "other.fake", "ports": [{"port": HTTP_PORT}]}],
    }
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {
            t: pool.submit(run, custom_objects, tenants[t], fetch_source(), allows[t], urls)
            for t in allows
        }
        results = {t: future.result()[1] for t, future in futures.items()}
    seen = {t: json.loads(results[t]["stdout"]) for t in results}
    assert seen["a"][urls[0]] == [200, f"fake internet {WEB_ADDRESS}\n"]
    assert seen["a"][urls[1]] == [403, ""]
    assert seen["b"][urls[1]] == [200, f"fake internet {OTHER_WEB_ADDRESS}\n"]
    assert seen["b"][urls[0]] == [403, ""]
    assert blocked_of(results["a"]) == {("other.fake", HTTP_PORT): 1}
    assert blocked_of(results["b"]) == {("allowed.fake", HTTP_PORT): 1}


@pytest.mark.usefixtures("proxy_operator")
def test_a_narrowed_tenant_cannot_name_other_hosts(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    hosts = [{"host": "allowed.fake"}]
    _, result = run(custom_objects, tenants["b"], "print(1)", hosts)
    assert (result["phase"], result["reason"]) == ("Error", "InvalidSpec")
    assert "host allowed.fake is outside this namespace's egress hosts" in result["message"]


@pytest.mark.usefixtures("proxy_operator")
@pytest.mark.parametrize(
    ("tool", "language", "program", "package", "host"),
    [
        # One execution: the import runs in a new interpreter (a session: see the end).
        ("pip", "python", INSTALL, PACKAGE, "pypi.fake"),
        ("npm", "javascript", NPM_INSTALL, NPM_PACKAGE, "npm.fake"),
    ],
    ids=["pip-from-a-package-index", "npm-from-a-registry"],
)
def test_install_from_the_fake_internet(
    custom_objects: client.CustomObjectsApi,
    tenants: dict[str, str],
    tool: str,
    language: str,
    program: str,
    package: str,
    host: str,
) -> None:
    source = program % {"port": HTTP_PORT, "package": package}
    hosts = [{"host": host, "ports": [{"port": HTTP_PORT}]}]
    _, result = run(custom_objects, tenants["a"], source, hosts, language=language)
    assert result["phase"] == "Succeeded", result
    assert f"{tool} exit 0" in result["stdout"], result["stdout"]
    assert PACKAGE_VALUE in result["stdout"], result["stdout"]
    assert not result.get("egressBlocked")


# requests and aiohttp (trust_env) read the proxy variables; each fetches argv's URLs
# (HTTPS without verifying the fake host's self-signed certificate) and prints a status line.
STANDARD_CLIENTS = """
import asyncio, sys, aiohttp, requests, urllib3
urllib3.disable_warnings()
for url in sys.argv[1:]:
    print("requests", url, requests.get(url, verify=False, timeout=15).status_code)
async def main():
    async with aiohttp.ClientSession(trust_env=True) as session:
        for url in sys.argv[1:]:
            async with session.get(url, ssl=False) as answer:
                print("aiohttp", url, answer.status)
asyncio.run(main())
"""
CURL = """
for url in "$@"; do echo "curl $url $(curl -sk -o /dev/null -w '%{http_code}' "$url")"; done
"""


@pytest.mark.usefixtures("proxy_operator")
def test_standard_clients_use_the_proxy_unchanged(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    urls = [
        f"http://allowed.fake:{HTTP_PORT}/whoami",
        f"https://allowed.fake:{HTTPS_PORT}/whoami",
        f"http://other.fake:{HTTP_PORT}/whoami",
    ]
    hosts = [{"host": "allowed.fake", "ports": [{"port": HTTP_PORT}, {"port": HTTPS_PORT}]}]
    expected = {urls[0]: "200", urls[1]: "200", urls[2]: "403"}
    for language, source, clients in (
        ("python", STANDARD_CLIENTS, ("requests", "aiohttp")),
        ("bash", CURL, ("curl",)),
    ):
        _, result = run(custom_objects, tenants["a"], source, hosts, urls, language=language)
        assert result["phase"] == "Succeeded", result
        lines = set(result["stdout"].splitlines())
        for name in clients:
            for url, code in expected.items():
                assert f"{name} {url} {code}" in lines, (name, url, result["stdout"])
        assert blocked_of(result) == {("other.fake", HTTP_PORT): len(clients)}


@pytest.mark.usefixtures("proxy_operator")
def test_tls_to_another_server_name_than_the_connect_name_is_refused_and_reported(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    """Domain fronting through an allowed host's address: the proxy peeks at the ClientHello
    and splices only a server name equal to the CONNECT name (none at all is refused too)."""
    hosts = [{"host": "allowed.fake", "ports": [{"port": HTTPS_PORT}]}]
    _, result = run(custom_objects, tenants["a"], FRONTING % {"port": HTTPS_PORT}, hosts)
    assert result["phase"] == "Succeeded", result
    seen = json.loads(result["stdout"])
    assert seen["allowed.fake"] == ["200", f"fake internet {WEB_ADDRESS}"]
    for server_name in ("other.fake", "null"):
        assert seen[server_name][:2] == ["200", "refused"], seen
    assert blocked_of(result) == {("other.fake", HTTPS_PORT): 1, ("allowed.fake", HTTPS_PORT): 1}


@pytest.mark.usefixtures("proxy_operator")
def test_benchmark_the_proxy_on_a_1mb_download(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    """benchmarks/proxy_latency.py in one sandbox: the proxy vs a direct allowlisted CIDR, over
    HTTP and HTTPS (peek and splice). Prints the numbers; no timing is asserted."""
    spec = execution_spec(
        "allowed.fake", WEB_ADDRESS, HTTP_PORT, "/big.bin", rounds=20, https_port=HTTPS_PORT
    )
    result = report(measure(custom_objects, tenants["a"], spec))
    print(f"\negress proxy, 1 MB download: {json.dumps(result)}")
    assert all(result[path] is not None for path in ("direct", "proxied", "direct_https"))
    assert result["proxied_https"] is not None


# --- sessions


@contextlib.contextmanager
def proxied_session(
    objects: client.CustomObjectsApi, namespace: str, hosts: list[dict[str, Any]], **spec: Any
) -> Iterator[str]:
    """A Ready python session whose allowlist names `hosts` (and `spec`); deleted (and gone)
    after, while the operator that holds its finalizer still runs."""
    name = f"sess-{uuid.uuid4().hex[:6]}"
    network = {"egress": "allowlist", "allow": hosts}
    try:
        open_session(
            objects, namespace, name, network=network, resources={"memory": "512Mi"}, **spec
        )
        yield name
    finally:
        read = functools.partial(
            objects.get_namespaced_custom_object, GROUP, VERSION, namespace, SESSION_PLURAL, name
        )
        if not is_gone(read):
            objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, name)
            wait_until(lambda: is_gone(read), timeout=60, what=f"session {name} to be deleted")


def run_in_session(
    objects: client.CustomObjectsApi,
    namespace: str,
    session: str,
    source: str,
    args: list[str] | None = None,
) -> tuple[str, dict[str, Any]]:
    name = f"{session}-{uuid.uuid4().hex[:4]}"
    return ran(objects, namespace, name, source, args, language="python", session=session)


@pytest.mark.usefixtures("proxy_operator")
def test_a_session_installs_a_package_that_its_next_execution_imports(
    custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api, tenants: dict[str, str]
) -> None:
    namespace = tenants["a"]
    hosts = [{"host": "pypi.fake", "ports": [{"port": HTTP_PORT}]}]
    with proxied_session(custom_objects, namespace, hosts) as session:
        assert session_of(custom_objects, namespace, session)["startMode"] == "cold"
        install = INSTALL % {"port": HTTP_PORT, "package": PACKAGE}
        _, installed = run_in_session(custom_objects, namespace, session, install)
        assert installed["phase"] == "Succeeded", installed
        assert "pip exit 0" in installed["stdout"], installed["stdout"]
        assert not installed.get("egressBlocked")
        # The session's interpreter started before the user site existed: it adds it.
        source = f"import {PACKAGE}\nprint({PACKAGE}.VALUE)"
        _, imported = run_in_session(custom_objects, namespace, session, source)
        assert (imported["phase"], imported["stdout"]) == ("Succeeded", f"{PACKAGE_VALUE}\n"), (
            imported
        )
        other = f"http://other.fake:{HTTP_PORT}/whoami"
        name, fetched = run_in_session(custom_objects, namespace, session, fetch_source(), [other])
        assert fetched["phase"] == "Succeeded", fetched
        assert json.loads(fetched["stdout"])[other] == [403, ""]
        assert blocked_of(fetched) == {("other.fake", HTTP_PORT): 1}
        wait_for_blocked_event(core_v1, namespace, name)
        assert session_of(custom_objects, namespace, session)["executionCount"] == 3


# --- grants bound to their sandbox

# Another sandbox's proxy credentials (argv[1], a proxy URL) tried for argv[3:], and this
# sandbox's own (HTTP_PROXY) for argv[2]; prints JSON (by URL, the last as "own").
STOLEN_GRANT = (
    FETCHING
    + """
def opener(proxy):
    handlers = [urllib.request.ProxyHandler({"http": proxy, "https": proxy})]
    return urllib.request.build_opener(*handlers, urllib.request.HTTPSHandler(context=context))
stolen = opener(sys.argv[1])
results = {url: fetch(stolen, url) for url in sys.argv[3:]}
results["own"] = fetch(opener(os.environ["HTTP_PROXY"]), sys.argv[2])
print(json.dumps(results))
"""
)
SHOW_GRANT = "import os; print(os.environ['HTTP_PROXY'])"


def steal(
    objects: client.CustomObjectsApi,
    namespace: str,
    grant: str,
    own: dict[str, Any],
    urls: list[str],
) -> dict[str, Any]:
    """An execution in `namespace`, allowed `own` (a host entry of its own, so that it reaches
    the proxy at all), that tries another sandbox's `grant` for `urls`: what it saw (JSON by
    URL, and "own": its own grant for its own host) and its status."""
    own_url = f"http://{own['host']}:{own['ports'][0]['port']}/whoami"
    _, result = run(objects, namespace, STOLEN_GRANT, [own], [grant, own_url, *urls])
    assert result["phase"] == "Succeeded", result
    return {"seen": json.loads(result["stdout"]), "status": result}


@pytest.mark.usefixtures("proxy_operator")
def test_a_grant_works_only_from_the_sandbox_it_was_issued_to(
    custom_objects: client.CustomObjectsApi, tenants: dict[str, str]
) -> None:
    """Tenant a's live session shows its proxy credentials; tenant b's sandbox and another of
    tenant a's own try them: refused (403) and counted for nobody, while the session still
    uses them; once the session has ended, they are refused everywhere."""
    urls = [f"http://allowed.fake:{HTTP_PORT}/whoami", f"https://allowed.fake:{HTTPS_PORT}/whoami"]
    hosts = [{"host": "allowed.fake", "ports": [{"port": HTTP_PORT}, {"port": HTTPS_PORT}]}]
    answer = f"fake internet {WEB_ADDRESS}"
    own = {
        "a": {"host": "allowed.fake", "ports": [{"port": HTTP_PORT}]},
        "b": {"host": "other.fake", "ports": [{"port": HTTP_PORT}]},
    }
    namespace = tenants["a"]
    with proxied_session(custom_objects, namespace, hosts) as session:
        _, shown = run_in_session(custom_objects, namespace, session, SHOW_GRANT)
        grant = shown["stdout"].strip()
        assert grant.startswith("http://sandpod:"), shown
        _, fetched = run_in_session(custom_objects, namespace, session, fetch_source(), urls)
        assert [json.loads(fetched["stdout"])[url] for url in urls] == [[200, f"{answer}\n"]] * 2

        for tenant in ("b", "a"):  # another tenant's sandbox, then another of the same tenant
            theft = steal(custom_objects, tenants[tenant], grant, own[tenant], urls)
            assert [theft["seen"][url] for url in urls] == [[403, ""]] * 2, (tenant, theft)
            assert theft["seen"]["own"][0] == 200, (tenant, theft)  # its own grant works
            assert not theft["status"].get("egressBlocked"), theft  # counted for nobody

        # The session's own next run: its grant still works, and it was charged nothing
        # for the refusals of the others.
        _, again = run_in_session(custom_objects, namespace, session, fetch_source(), urls)
        assert [json.loads(again["stdout"])[url] for url in urls] == [[200, f"{answer}\n"]] * 2
        assert not again.get("egressBlocked"), again

    # The session has ended (deleted, its pod gone): its grant opens nothing, anywhere.
    theft = steal(custom_objects, tenants["b"], grant, own["b"], urls)
    assert [theft["seen"][url] for url in urls] == [[403, ""]] * 2, theft


@pytest.mark.usefixtures("proxy_operator")
def test_a_sessions_grant_is_refused_once_the_session_has_ended(
    custom_objects: client.CustomObjectsApi, core_v1: client.CoreV1Api, tenants: dict[str, str]
) -> None:
    """Ended by the platform (its idle timeout), not deleted: its pod is gone, and the
    session's grant, still within its signed expiry (lifetime + the longest run), is refused
    from the pod of a later execution of the same tenant."""
    namespace = tenants["a"]
    hosts = [{"host": "allowed.fake", "ports": [{"port": HTTP_PORT}]}]
    url = f"http://allowed.fake:{HTTP_PORT}/whoami"
    with proxied_session(custom_objects, namespace, hosts, idleTimeoutSeconds=10) as session:
        _, shown = run_in_session(custom_objects, namespace, session, SHOW_GRANT)
        grant = shown["stdout"].strip()
        assert grant.startswith("http://sandpod:"), shown
        wait_until(
            lambda: session_of(custom_objects, namespace, session).get("phase") == "Ended",
            timeout=120,
            what=f"session {session} to end when idle",
        )
        pod = session_of(custom_objects, namespace, session)["podName"]
        wait_until(
            lambda: is_gone(functools.partial(core_v1.read_namespaced_pod, pod, namespace)),
            timeout=60,
            what=f"the ended session's pod {pod} to be deleted",
        )
        theft = steal(custom_objects, namespace, grant, hosts[0], [url])
    assert theft["seen"][url] == [403, ""], theft
    assert theft["seen"]["own"][0] == 200, theft
