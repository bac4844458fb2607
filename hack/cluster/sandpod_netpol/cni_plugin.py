#!/usr/bin/python3
"""sandpod-netpol: a chained CNI plugin that holds pod network setup until policies are in place.

Install it as `sandpod-netpol` in the CNI bin dir and add it as the last plugin
of the pod network's conflist:

    {"type": "sandpod-netpol", "socket": "/run/sandpod-netpol.sock"}

ADD tells the enforcer (python -m sandpod_netpol run) the pod's namespace,
name and IP and waits until the enforcer has programmed the pod; no container
of the pod starts before ADD returns. If the enforcer does not confirm, ADD
fails and the kubelet retries the sandbox later: fail closed. DEL tells the
enforcer the network is gone and succeeds even when the enforcer is down, so
pods can always be torn down. Standard library only: it runs under the system
Python, outside any virtualenv.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

SUPPORTED_VERSIONS = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
DEFAULT_SOCKET = "/run/sandpod-netpol.sock"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEL_TIMEOUT_SECONDS = 5.0

# CNI spec error codes
INCOMPATIBLE_VERSION = 1
INVALID_ENVIRONMENT = 4
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11


class PluginError(Exception):
    def __init__(self, code: int, message: str, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def parse_cni_args(text: str) -> dict[str, str]:
    """CNI_ARGS is "K1=V1;K2=V2"."""
    pairs = (item.split("=", 1) for item in text.split(";") if "=" in item)
    return {key: value for key, value in pairs}


def first_ipv4(prev_result: Mapping[str, Any]) -> str:
    for entry in prev_result.get("ips") or []:
        address = str(entry.get("address") or "").split("/", 1)[0]
        try:
            if ipaddress.ip_address(address).version == 4:
                return address
        except ValueError:
            continue
    raise PluginError(INVALID_CONFIG, "prevResult has no IPv4 address for the pod")


def ask_enforcer(socket_path: str, request: Mapping[str, Any], timeout: float) -> None:
    """Send one request, wait for its answer; raise PluginError unless it is ok."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout)
            connection.connect(socket_path)
            connection.sendall(json.dumps(request).encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                answer += chunk
    except OSError as error:
        raise PluginError(
            TRY_AGAIN_LATER, "the sandpod NetworkPolicy enforcer did not answer", repr(error)
        ) from None
    try:
        response = json.loads(answer)
    except ValueError:
        raise PluginError(
            TRY_AGAIN_LATER, "garbled answer from the enforcer", repr(answer)
        ) from None
    if not response.get("ok"):
        raise PluginError(
            TRY_AGAIN_LATER, "the enforcer refused the pod", str(response.get("error"))
        )


def run(command: str, environ: Mapping[str, str], stdin: str) -> dict[str, Any] | None:
    """One plugin invocation; returns what to print on stdout (None: nothing)."""
    if command == "VERSION":
        return {"cniVersion": "1.0.0", "supportedVersions": SUPPORTED_VERSIONS}
    try:
        conf = json.loads(stdin)
    except ValueError as error:
        raise PluginError(INVALID_CONFIG, "network configuration is not JSON", str(error)) from None
    cni_version = str(conf.get("cniVersion") or "0.4.0")
    if cni_version not in SUPPORTED_VERSIONS:
        raise PluginError(INCOMPATIBLE_VERSION, f"unsupported cniVersion {cni_version}")
    if command in ("GC", "STATUS"):
        return None
    args = parse_cni_args(environ.get("CNI_ARGS", ""))
    namespace = args.get("K8S_POD_NAMESPACE", "")
    name = args.get("K8S_POD_NAME", "")
    container_id = environ.get("CNI_CONTAINERID", "")
    if command == "DEL" and not (namespace and name and container_id):
        return None  # not a pod the enforcer could know; teardown must succeed
    if not namespace or not name or not container_id:
        raise PluginError(
            INVALID_ENVIRONMENT, "K8S_POD_NAMESPACE, K8S_POD_NAME or CNI_CONTAINERID missing"
        )
    socket_path = str(conf.get("socket") or DEFAULT_SOCKET)
    timeout = float(conf.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS)
    request: dict[str, Any] = {
        "command": command,
        "namespace": namespace,
        "name": name,
        "containerId": container_id,
        "uid": args.get("K8S_POD_UID"),
    }
    if command == "DEL":
        try:
            ask_enforcer(socket_path, request, DEL_TIMEOUT_SECONDS)
        except PluginError as error:
            # Teardown must never get stuck; a dead pod's address is harmless.
            print(f"sandpod-netpol: DEL not confirmed: {error} {error.details}", file=sys.stderr)
        return None
    prev_result = conf.get("prevResult")
    if not isinstance(prev_result, dict):
        raise PluginError(
            INVALID_CONFIG, "no prevResult: sandpod-netpol must follow the bridge plugin"
        )
    request["ip"] = first_ipv4(prev_result)
    if command == "ADD":
        ask_enforcer(socket_path, request, timeout)
        return {**prev_result, "cniVersion": cni_version}
    if command == "CHECK":
        ask_enforcer(socket_path, request, timeout)
        return None
    raise PluginError(INVALID_ENVIRONMENT, f"unknown CNI_COMMAND {command!r}")


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    try:
        output = run(command, os.environ, sys.stdin.read())
    except PluginError as error:
        json.dump(
            {
                "cniVersion": "1.0.0",
                "code": error.code,
                "msg": str(error),
                "details": error.details,
            },
            sys.stdout,
        )
        return 1
    if output is not None:
        json.dump(output, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
