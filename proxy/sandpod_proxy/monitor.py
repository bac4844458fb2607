"""The egress proxy's monitor: counts refused requests from Squid's access log.

    sandpod-proxy-monitor --log-port 9181 --http-port 9180

Squid sends each access-log line (logformat sandpod: "%ea %>rd %>rP %Ss %>Hs %rm
%ssl::bump_mode %#ssl::>sni") over TCP to 127.0.0.1:9181 as it happens (access_log tcp://,
buffered_logs off; the udp module buffers). Refused requests with an execution (%ea, from the
grant helper) are counted per execution and destination: TCP_DENIED (by host and port), and
CONNECTs whose TLS server name was refused (bump mode "terminate"; by the server name the client
sent, else the CONNECT host). HTTP: GET /blocked/<uid> -> [{host, port, count}], GET /metrics
-> Prometheus text. Counts are kept for the most recent executions only.
"""

import argparse
import json
import socket
import threading
import urllib.parse
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_EXECUTIONS = 10000
MAX_DESTINATIONS = 100  # per execution
MAX_LINE_BYTES = 8192


@dataclass
class Tally:
    """Refusals per execution (uid -> (host, port) -> count) and totals for metrics."""

    blocked: OrderedDict[str, Counter[tuple[str, int]]] = field(default_factory=OrderedDict)
    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (decision, namespace)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, line: str) -> None:
        parts = line.split()
        if len(parts) < 4:
            return
        who, host, port, status = urllib.parse.unquote(parts[0]), parts[1], parts[2], parts[3]
        method, bump, sni = (parts + ["-"] * 4)[5:8]
        if _follow_up(status, method, bump, sni):
            return
        uid, _, namespace = who.partition("/")
        terminated = bump == "terminate"
        denied = status.startswith("TCP_DENIED") or terminated
        if terminated and sni != "-":
            host = urllib.parse.unquote(sni)
        with self.lock:
            self.decisions[("blocked" if denied else "allowed", namespace or "-")] += 1
            if not denied or not uid or uid == "-" or not port.isdigit():
                return
            counts = self.blocked.setdefault(uid, Counter())
            self.blocked.move_to_end(uid)
            if (host, int(port)) in counts or len(counts) < MAX_DESTINATIONS:
                counts[(host, int(port))] += 1
            while len(self.blocked) > MAX_EXECUTIONS:
                self.blocked.popitem(last=False)

    def report(self, uid: str) -> list[dict[str, object]]:
        with self.lock:
            counts: dict[tuple[str, int], int] = dict(self.blocked.get(uid, Counter()))
        return [{"host": h, "port": p, "count": n} for (h, p), n in sorted(counts.items())]

    def metrics(self) -> str:
        lines = [
            "# HELP sandpod_egress_proxy_requests_total Requests through the egress proxy.",
            "# TYPE sandpod_egress_proxy_requests_total counter",
        ]
        with self.lock:
            for (decision, namespace), count in sorted(self.decisions.items()):
                labels = f'decision="{decision}",namespace="{_label(namespace)}"'
                lines.append(f"sandpod_egress_proxy_requests_total{{{labels}}} {count}")
        return "\n".join(lines) + "\n"


def _follow_up(status: str, method: str, bump: str, sni: str) -> bool:
    """Whether a line follows a CONNECT already logged: the tunnel Squid opens itself once it
    spliced one, or the error page it serves inside a refused one (any request with a TLS
    server name but CONNECT)."""
    spliced_tunnel = bump == "splice" and status == "TCP_TUNNEL"
    return spliced_tunnel or (method != "CONNECT" and sni != "-")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def read_log(tally: Tally, connection: socket.socket) -> None:
    with connection, connection.makefile("rb") as lines:
        for line in lines:
            tally.record(line[:MAX_LINE_BYTES].decode(errors="replace"))


def serve_log(tally: Tally, port: int) -> None:
    """Squid's log connections (one per Squid process, again after a reconfigure)."""
    listener = socket.create_server(("127.0.0.1", port), reuse_port=True)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=read_log, args=(tally, connection), daemon=True).start()


def handler_for(tally: Tally) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(tally.metrics(), "text/plain; version=0.0.4")
            elif self.path.startswith("/blocked/"):
                uid = self.path.removeprefix("/blocked/")
                self._answer(json.dumps(tally.report(uid)), "application/json")
            elif self.path == "/healthz":
                self._answer("ok\n", "text/plain")
            else:
                self.send_error(404)

        def _answer(self, body: str, content_type: str) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-port", type=int, default=9181)
    parser.add_argument("--http-port", type=int, default=9180)
    args = parser.parse_args()
    tally = Tally()
    threading.Thread(target=serve_log, args=(tally, args.log_port), daemon=True).start()
    ThreadingHTTPServer(("", args.http_port), handler_for(tally)).serve_forever()


if __name__ == "__main__":
    main()
