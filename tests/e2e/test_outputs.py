"""Files that come back (issue 16) on the cluster: what a program leaves in /tmp/outputs,
read with kubectl alone (the execution's outputs ConfigMap) and through the gateway (inline
and GET /v1/executions/{id}/files/{path}); matplotlib figures; hostile outputs directories.

The 10 GB sparse file needs a file size limit above 10 GB (SANDPOD_FILE_SIZE_LIMIT_BYTES in
the environment of the session's operator); under the default 100 MiB the program makes the
largest sparse file it may, which is still far past what the runner reads.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_release import DeployedGateway
from executions import create, kubectl, status, wait_for
from kubernetes import client
from sandpod_testkit.paths import CRD_PATH

WRITES_CSV_AND_PNG = """\
import os, struct, zlib
out = os.environ["SANDPOD_OUTPUTS"]
with open(os.path.join(out, "table.csv"), "w") as f:
    f.write("x,y\\n" + "".join(f"{i},{i * i}\\n" for i in range(1000)))

def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

rows = b"".join(b"\\x00" + bytes((x * 7 + y) % 256 for x in range(64)) for y in range(64))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 0, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
os.makedirs(os.path.join(out, "img"))
with open(os.path.join(out, "img", "gradient.png"), "wb") as f:
    f.write(png)
print("wrote", len(png))
"""

PLOTS = """\
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
plt.show()
plt.figure()
plt.bar(["a", "b"], [3, 5])  # left open: saved at exit
print("plotted")
"""

HOSTILE = """\
import os, signal
out = os.environ["SANDPOD_OUTPUTS"]
os.symlink("/etc/passwd", os.path.join(out, "passwd"))
os.mkfifo(os.path.join(out, "fifo"))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
with open(os.path.join(out, "sparse.bin"), "wb") as f:
    for size in (10 * 2**30, 100 * 2**20 - 1):  # the file size limit may forbid 10 GB
        try:
            f.truncate(size)
            break
        except OSError:
            continue
print("sparse", os.stat(os.path.join(out, "sparse.bin")).st_size)
many = os.path.join(out, "many")
os.mkdir(many)
for i in range(10_000):
    with open(os.path.join(many, f"f{i:05d}.txt"), "w") as f:
        f.write("x")
with open(os.path.join(out, "a-kept.txt"), "w") as f:
    f.write("kept")
print("done")
"""


def merged(cluster: Any, ours: Any) -> Any:
    """`ours` laid over `cluster`: mappings merged key by key, lists united."""
    if isinstance(cluster, dict) and isinstance(ours, dict):
        return {**cluster, **{k: merged(cluster.get(k), v) for k, v in ours.items()}}
    if isinstance(cluster, list) and isinstance(ours, list):
        return cluster + [item for item in ours if item not in cluster]
    return ours


@pytest.fixture(autouse=True)
def output_fields_in_the_crd(sandpod_crd: str, api_client: client.ApiClient) -> None:
    """The CRD is cluster-wide and shared with concurrent test sessions of other branches,
    each applying its own: add this branch's fields (spec.files[].encoding, status.outputs,
    ...) to whatever is there rather than replace theirs, or the API server prunes ours."""
    extensions = client.ApiextensionsV1Api(api_client)
    current = api_client.sanitize_for_serialization(
        extensions.read_custom_resource_definition(sandpod_crd)
    )
    ours = yaml.safe_load(CRD_PATH.read_text())
    body = {**current, "spec": merged(current["spec"], ours["spec"])}
    body.pop("status", None)
    extensions.replace_custom_resource_definition(sandpod_crd, body)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the inflated IDAT of a PNG: it decodes, chunk CRCs included."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    width, height = struct.unpack(">II", header[:8])
    return width, height, zlib.decompress(idat)


def configmap_file(kubeconfig: Path, namespace: str, configmap: str, key: str) -> bytes:
    """What a kubectl user does: the binaryData entry, base64-decoded."""
    jsonpath = "{.binaryData." + key + "}"
    found = kubectl(
        kubeconfig, "-n", namespace, "get", "cm", configmap, "-o", f"jsonpath={jsonpath}"
    )
    assert found.returncode == 0, found.stderr
    return base64.b64decode(found.stdout)


@dataclass
class ClusterRun:
    """Runs a python program as a CodeExecution in the test's namespace, read as kubectl
    users read it."""

    objects: client.CustomObjectsApi
    namespace: str
    kubeconfig: Path

    def to_end(self, source: str) -> dict[str, Any]:
        create(
            self.objects, self.namespace, "out", language="python", source=source, timeoutSeconds=60
        )
        return status(wait_for(self.objects, self.namespace, "out", timeout=180))

    def file(self, found: dict[str, Any], key: str) -> bytes:
        return configmap_file(self.kubeconfig, self.namespace, found["outputsConfigMap"], key)


@pytest.fixture
def cluster(
    sandpod_operator: Any,
    custom_objects: client.CustomObjectsApi,
    namespace: str,
    kubeconfig_path: Path,
) -> ClusterRun:
    return ClusterRun(custom_objects, namespace, kubeconfig_path)


def test_a_csv_and_a_png_come_back_intact_through_kubectl(cluster: ClusterRun) -> None:
    found = cluster.to_end(WRITES_CSV_AND_PNG)

    assert found["phase"] == "Succeeded", found
    assert found["reportedBy"] == "runner"
    outputs = {o["path"]: o for o in found["outputs"]}
    assert set(outputs) == {"table.csv", "img/gradient.png"}
    assert outputs["table.csv"]["mediaType"] == "text/csv"
    assert outputs["img/gradient.png"]["mediaType"] == "image/png"
    for entry in outputs.values():
        assert entry["stored"] is True
        content = cluster.file(found, entry["key"])
        assert (len(content), sha256(content)) == (entry["size"], entry["sha256"])
    png = cluster.file(found, outputs["img/gradient.png"]["key"])
    width, height, pixels = png_pixels(png)
    assert (width, height, len(pixels)) == (64, 64, 64 * 65)
    csv = cluster.file(found, outputs["table.csv"]["key"])
    assert csv.startswith(b"x,y\n0,0\n1,1\n") and csv.endswith(b"999,998001\n")


@pytest.fixture
def tenant(gateway: DeployedGateway, namespace: str) -> Iterator[httpx.Client]:
    key = gateway.add_tenant(namespace, namespace, maxTimeoutSeconds=120, maxInlineFileBytes=8192)
    with gateway.client(key) as http:
        yield http


def test_files_come_back_through_the_gateway_inline_and_by_path(tenant: httpx.Client) -> None:
    response = tenant.post(
        "/v1/executions",
        json={"language": "python", "code": WRITES_CSV_AND_PNG, "timeout_seconds": 60},
    )
    result = response.json()

    assert result["status"] == "success", result
    files = {f["path"]: f for f in result["files"]}
    png, csv = files["img/gradient.png"], files["table.csv"]
    # The PNG fits in the tenant's 8 KiB inline limit; the 8.9 KB CSV does not.
    inline = base64.b64decode(png["content_base64"])
    assert sha256(inline) == png["sha256"]
    assert csv["content_base64"] is None and csv["stored"] is True
    for entry in (png, csv):
        fetched = tenant.get(f"/v1/executions/{result['id']}/files/{entry['path']}")
        assert fetched.status_code == 200
        assert fetched.headers["content-type"].startswith(entry["media_type"])
        assert sha256(fetched.content) == entry["sha256"]
    missing = tenant.get(f"/v1/executions/{result['id']}/files/nope.txt")
    assert missing.status_code == 404


def test_binary_input_files_reach_the_program(tenant: httpx.Client) -> None:
    blob = bytes(range(256))
    code = (
        "import hashlib, os\n"
        "data = open('in.bin', 'rb').read()\n"
        "print(hashlib.sha256(data).hexdigest())\n"
        "open(os.path.join(os.environ['SANDPOD_OUTPUTS'], 'copy.bin'), 'wb').write(data)\n"
    )
    files = [{"path": "in.bin", "content_base64": base64.b64encode(blob).decode()}]
    result = tenant.post(
        "/v1/executions", json={"language": "python", "code": code, "files": files}
    ).json()

    assert result["status"] == "success", result
    assert result["stdout"] == sha256(blob) + "\n"
    assert base64.b64decode(result["files"][0]["content_base64"]) == blob


def test_shown_and_open_figures_come_back_as_pngs(cluster: ClusterRun) -> None:
    found = cluster.to_end(PLOTS)

    assert found["phase"] == "Succeeded", found
    assert found.get("stderr", "") == ""
    outputs = {o["path"]: o for o in found["outputs"]}
    assert set(outputs) == {"figure-1.png", "figure-2.png"}
    for entry in outputs.values():
        assert entry["mediaType"] == "image/png"
        png = cluster.file(found, entry["key"])
        assert sha256(png) == entry["sha256"]
        width, height, pixels = png_pixels(png)
        assert width > 100 and height > 100 and len(pixels) > width * height


def test_a_hostile_outputs_dir_gives_a_clear_result_and_nothing_from_outside(
    cluster: ClusterRun,
) -> None:
    found = cluster.to_end(HOSTILE)

    assert found["phase"] == "Succeeded", found
    assert found["stdout"].endswith("done\n")
    if int(os.environ.get("SANDPOD_FILE_SIZE_LIMIT_BYTES", "0")) > 10 * 2**30:
        assert f"sparse {10 * 2**30}\n" in found["stdout"]
    paths = [o["path"] for o in found["outputs"]]
    # The walk is sorted: a-kept.txt first, then files of many/ up to the 64-file limit;
    # the symlink, the fifo and the sparse file are skipped, never opened or read.
    assert paths[0] == "a-kept.txt"
    assert len(paths) == 64 and all(p.startswith("many/") for p in paths[1:])
    assert not {"passwd", "fifo", "sparse.bin"} & set(paths)
    assert found["outputsTruncated"] is True
    stored = cluster.file(found, found["outputs"][0]["key"])
    assert stored == b"kept"
    everything = kubectl(
        cluster.kubeconfig,
        "-n",
        cluster.namespace,
        "get",
        "cm",
        found["outputsConfigMap"],
        "-o",
        "json",
    ).stdout
    assert "root:" not in everything and base64.b64encode(b"root:x:0:0").decode() not in everything
