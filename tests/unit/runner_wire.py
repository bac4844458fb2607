"""The runner's side of docs/runner-protocol.md, for tests: MAC'd frames and summaries as
the runner writes them (the product only ever reads them, in sandpod_contract.runner)."""

import base64
import hashlib
import json
from typing import Any

from sandpod_contract.runner import frame_mac

KEY = bytes(range(32))
Output = tuple[str, str]


def result(**fields: Any) -> dict[str, Any]:
    """A result object with every field the runner writes."""
    return {
        "exitCode": 0,
        "signal": None,
        "timedOut": False,
        "durationMs": 40,
        "stdoutBytes": 0,
        "stderrBytes": 0,
        "stdoutTruncated": False,
        "stderrTruncated": False,
        "peakMemoryBytes": 12_000_000,
        "diagnostics": None,
        "error": None,
        **fields,
    }


def frame(seq: int, stream: str, data: str, key: bytes = KEY) -> dict[str, Any]:
    return {"seq": seq, "stream": stream, "data": data, "mac": frame_mac(key, seq, stream, data)}


def summary(runner_result: dict[str, Any], frames: int, key: bytes = KEY) -> dict[str, Any]:
    return {"result": runner_result, "frames": frames, "key": key.hex()}


def termination_message(runner_result: dict[str, Any], frames: int, key: bytes = KEY) -> str:
    return json.dumps(summary(runner_result, frames, key), separators=(",", ":"))


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def pod_log(outputs: list[Output], runner_result: dict[str, Any], key: bytes = KEY) -> bytes:
    """Output frames numbered from 1, then the summary: the pod log of a run."""
    frames = [frame(seq, stream, data, key) for seq, (stream, data) in enumerate(outputs, 1)]
    return lines(*frames, summary(runner_result, len(frames), key))


def file_frames(path: str, content: bytes, chunk: int = 6 * 1024) -> list[Output]:
    """The (stream, data) pairs of one output file: base64 chunks on `file:<path>`."""
    return [
        (f"file:{path}", base64.b64encode(content[start : start + chunk]).decode())
        for start in range(0, len(content), chunk)
    ]


def listing(path: str, content: bytes, media_type: str = "application/octet-stream") -> dict:
    """The summary's entry for an output file."""
    digest = hashlib.sha256(content).hexdigest()
    return {"path": path, "size": len(content), "sha256": digest, "mediaType": media_type}
