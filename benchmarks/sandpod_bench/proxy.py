"""A counting proxy in front of the Kubernetes API server: the operator under measurement
talks plain HTTP to it (a kubeconfig without credentials), the proxy forwards every request
with the real kubeconfig's credentials and counts it by verb and resource. This counts
everything the operator process sends, kopf's watches and bookkeeping patches included;
`GET /.bench/counts` answers the counts as JSON.

    python -m sandpod_bench.proxy --kubeconfig ~/.kube/config --port 8001
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ssl
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

COUNTS_PATH = "/.bench/counts"
# Hop-by-hop headers and those aiohttp recomputes for the body it sends.
DROPPED_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "upgrade",
        "proxy-connection",
        "te",
        "trailer",
    }
)


def classify(method: str, path: str, query: Mapping[str, str]) -> tuple[str, str]:
    """(verb, resource) of an API request, as the API server's audit log names them:
    get/list/watch/create/update/patch/delete/deletecollection, and `pods`, `pods/log`,
    `codeexecutions/status`...; ("get", "discovery") for discovery and version requests."""
    segments = [part for part in path.split("/") if part]
    if segments[:2] == ["api", "v1"]:
        rest = segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        rest = segments[3:]
    else:
        return ("get" if method == "GET" else method.lower(), "discovery")
    if not rest:
        return ("get", "discovery")
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource
    padded: list[str | None] = [*rest, None, None]
    resource, name, subresource = padded[0], padded[1], padded[2]
    full = f"{resource}/{subresource}" if subresource else str(resource)
    is_item = name is not None
    if method == "GET":
        verb = "watch" if query.get("watch") in ("true", "1") else "get" if is_item else "list"
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if is_item else "deletecollection"
    else:
        verb = method.lower()
    return verb, full


def upstream_from_kubeconfig(path: Path) -> tuple[str, ssl.SSLContext | None, dict[str, str]]:
    """Server URL, TLS context (client certificate included) and auth headers of the
    kubeconfig's current context."""
    config = yaml.safe_load(path.read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user: dict[str, Any] = next(
        (u["user"] for u in config.get("users") or [] if u["name"] == context.get("user")), {}
    )
    server = str(cluster["server"]).rstrip("/")
    headers: dict[str, str] = {}
    if user.get("token"):
        headers["Authorization"] = f"Bearer {user['token']}"
    if not server.startswith("https://"):
        return server, None, headers
    tls = ssl.create_default_context()
    if cluster.get("certificate-authority-data"):
        tls.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif cluster.get("certificate-authority"):
        tls.load_verify_locations(cafile=cluster["certificate-authority"])
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    if user.get("client-certificate-data"):
        with tempfile.TemporaryDirectory() as directory:
            cert, key = Path(directory, "cert.pem"), Path(directory, "key.pem")
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            tls.load_cert_chain(cert, key)
    elif user.get("client-certificate"):
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
    return server, tls, headers


class CountingProxy:
    def __init__(self, server: str, tls: ssl.SSLContext | None, headers: dict[str, str]) -> None:
        self._server = server
        self._tls = tls
        self._headers = headers
        self.counts: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._tls if self._tls else False, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == COUNTS_PATH:
            return web.json_response(dict(self.counts))
        verb, resource = classify(request.method, request.path, request.query)
        self.counts[f"{verb} {resource}"] += 1
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED_HEADERS}
        headers.update(self._headers)
        body = await request.read()
        async with self._session.request(
            request.method,
            self._server + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED_HEADERS
                },
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


async def serve(kubeconfig: Path, port: int) -> None:
    proxy = CountingProxy(*upstream_from_kubeconfig(kubeconfig))
    await proxy.open()
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await proxy.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    arguments = parser.parse_args(argv)
    asyncio.run(serve(arguments.kubeconfig, arguments.port))


def proxy_kubeconfig(port: int) -> dict[str, Any]:
    """A kubeconfig that sends a client through the proxy."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench-proxy", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "bench-proxy", "user": {}}],
        "contexts": [
            {"name": "bench-proxy", "context": {"cluster": "bench-proxy", "user": "bench-proxy"}}
        ],
        "current-context": "bench-proxy",
    }


if __name__ == "__main__":
    main()
