"""The runner's own python session kernel (its source read from images/runner), run in a real
Python subprocess and spoken to as the runner does (docs/runner-protocol.md, "Session mode"):
a run's source over fd 3 with its stdin, stdout and stderr passed along, the answer with its
exit code and the repr of its trailing value."""

import json
import os
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

KERNEL_GO = Path(__file__).parents[2] / "images/runner/internal/runner/kernel.go"


def kernel_source() -> str:
    text = KERNEL_GO.read_text()
    start = text.index("const pythonKernel = `") + len("const pythonKernel = `")
    return text[start : text.index("`", start)]


@dataclass(frozen=True)
class KernelRun:
    exit_code: int
    stdout: str
    stderr: str
    value: str | None


class PythonKernel:
    def __init__(self, work: Path) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.channel = ours
        self.number = 0
        self.process = subprocess.Popen(
            [sys.executable, "-c", kernel_source()],
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3,),
            preexec_fn=lambda: os.dup2(theirs.fileno(), 3),
        )
        theirs.close()
        if self.channel.recv(1) != b"R":
            raise RuntimeError("the kernel did not start")

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.channel.recv(size - len(data))
            if not chunk:
                raise RuntimeError("the kernel's channel ended")
            data += chunk
        return data

    def run(self, source: str) -> KernelRun:
        self.number += 1
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        os.close(stdin_w)
        captured: dict[int, bytes] = {}

        def drain(fd: int) -> None:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            os.close(fd)
            captured[fd] = b"".join(chunks)

        readers = [threading.Thread(target=drain, args=(fd,)) for fd in (out_r, err_r)]
        for reader in readers:
            reader.start()
        body = json.dumps({"run": self.number, "source": source, "argv": ["main.py"]}).encode()
        socket.send_fds(self.channel, [struct.pack(">I", len(body))], [stdin_r, out_w, err_w])
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        self.channel.sendall(body)
        (size,) = struct.unpack(">I", self._read(4))
        done = json.loads(self._read(size))
        for reader in readers:
            reader.join()
        return KernelRun(
            done["exitCode"],
            captured[out_r].decode(),
            captured[err_r].decode(),
            done["value"],
        )

    def close(self) -> None:
        self.channel.close()
        self.process.wait(timeout=10)
