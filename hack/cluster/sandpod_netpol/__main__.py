"""python -m sandpod_netpol run|cleanup"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from ipaddress import IPv4Network
from pathlib import Path

from sandpod_netpol import kernel
from sandpod_netpol.enforcer import EnforcerConfig, run_enforcer

DEFAULT_SOCKET = Path("/run/sandpod-netpol.sock")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandpod_netpol", description="NetworkPolicy enforcer for one node"
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="enforce until SIGTERM (rules stay in place after)")
    run.add_argument("--kubeconfig", type=Path, required=True)
    run.add_argument("--node-name", required=True)
    run.add_argument("--pod-cidr", type=IPv4Network, required=True, help="this node's pod CIDR")
    run.add_argument("--socket", type=Path, default=DEFAULT_SOCKET, help="CNI plugin socket")
    run.add_argument("--bridge", default="cni0", help="the CNI bridge pods are attached to")
    run.add_argument(
        "--state-file",
        type=Path,
        help="where CNI attachments survive restarts (default: next to the socket)",
    )
    run.add_argument("--resync-seconds", type=float, default=10.0)
    commands.add_parser("cleanup", help="remove every chain, hook and ipset of the enforcer")
    return parser


async def _run_until_signalled(settings: EnforcerConfig) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await run_enforcer(settings)
    except asyncio.CancelledError:
        logging.getLogger("sandpod_netpol").info("stopping; rules stay in place")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "cleanup":
        kernel.cleanup()
        return 0
    socket_path: Path = args.socket
    settings = EnforcerConfig(
        kubeconfig=args.kubeconfig,
        node_name=args.node_name,
        pod_cidr=args.pod_cidr,
        bridge=args.bridge,
        socket_path=socket_path,
        state_path=args.state_file or socket_path.with_name(f"{socket_path.stem}.state.json"),
        resync_seconds=args.resync_seconds,
    )
    asyncio.run(_run_until_signalled(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
