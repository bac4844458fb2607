"""The CNI plugin's parsing and its answers that need no enforcer.

The plugin talking to a real enforcer is covered in test_netpol_kernel.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sandpod_netpol.cni_plugin import (
    INCOMPATIBLE_VERSION,
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    PluginError,
    first_ipv4,
    parse_cni_args,
    run,
)

ENV = {
    "CNI_CONTAINERID": "abc123",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=job-1;K8S_POD_UID=u1",
}


def conf(tmp_path: Path, **extra: Any) -> str:
    return json.dumps(
        {"cniVersion": "1.0.0", "name": "sandpod", "socket": str(tmp_path / "none.sock"), **extra}
    )


def test_parse_cni_args() -> None:
    assert parse_cni_args(ENV["CNI_ARGS"]) == {
        "IgnoreUnknown": "1",
        "K8S_POD_NAMESPACE": "team-a",
        "K8S_POD_NAME": "job-1",
        "K8S_POD_UID": "u1",
    }
    assert parse_cni_args("") == {}


def test_first_ipv4_skips_ipv6() -> None:
    result = {"ips": [{"address": "fd00::5/64"}, {"address": "10.244.0.5/24"}]}
    assert first_ipv4(result) == "10.244.0.5"


def test_no_ipv4_is_a_config_error() -> None:
    with pytest.raises(PluginError) as raised:
        first_ipv4({"ips": [{"address": "fd00::5/64"}]})
    assert raised.value.code == INVALID_CONFIG


def test_version_needs_no_config() -> None:
    answer = run("VERSION", {}, "")
    assert answer is not None and "0.4.0" in answer["supportedVersions"]


def test_add_without_prev_result_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as raised:
        run("ADD", ENV, conf(tmp_path))
    assert raised.value.code == INVALID_CONFIG


def test_add_without_kubernetes_args_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as raised:
        run("ADD", {"CNI_CONTAINERID": "abc"}, conf(tmp_path))
    assert raised.value.code == INVALID_ENVIRONMENT


def test_unsupported_cni_version_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginError) as raised:
        run("ADD", ENV, json.dumps({"cniVersion": "0.2.0"}))
    assert raised.value.code == INCOMPATIBLE_VERSION


def test_add_fails_closed_without_an_enforcer(tmp_path: Path) -> None:
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.244.0.5/24"}]}
    with pytest.raises(PluginError) as raised:
        run("ADD", ENV, conf(tmp_path, prevResult=prev))
    assert raised.value.code == 11


def test_del_succeeds_without_an_enforcer(tmp_path: Path) -> None:
    assert run("DEL", ENV, conf(tmp_path)) is None


def test_del_succeeds_without_kubernetes_args(tmp_path: Path) -> None:
    assert run("DEL", {}, conf(tmp_path)) is None


def test_gc_and_status_are_no_ops(tmp_path: Path) -> None:
    assert run("GC", ENV, conf(tmp_path, cniVersion="1.1.0")) is None
    assert run("STATUS", ENV, conf(tmp_path, cniVersion="1.1.0")) is None
