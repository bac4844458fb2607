"""Putting a Ruleset into the kernel, and taking everything of ours out again.

Runs the iptables/ipset command-line tools (Debian's nf_tables iptables);
every change of our chains is one iptables-restore transaction.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Collection, Sequence
from ipaddress import IPv4Address
from pathlib import Path

from sandpod_netpol.rules import (
    HOOKS,
    Family,
    Ruleset,
    cleanup_restore_text,
    hook_commands,
    is_our_set,
    parse_saved_filter_table,
)

log = logging.getLogger(__name__)

FAMILIES: tuple[Family, ...] = (4, 6)
SAVE_COMMAND = {4: "iptables-save", 6: "ip6tables-save"}
RESTORE_COMMAND = {4: "iptables-restore", 6: "ip6tables-restore"}
# Without these, bridged pod-to-pod packets never reach iptables at all.
BRIDGE_NETFILTER_SYSCTLS = (
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables"),
    Path("/proc/sys/net/bridge/bridge-nf-call-ip6tables"),
)
COMMAND_TIMEOUT_SECONDS = 60


class CommandError(RuntimeError):
    pass


def run_command(argv: Sequence[str], stdin: str | None = None) -> str:
    try:
        result = subprocess.run(
            list(argv),
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CommandError(f"{argv[0]}: {error}") from error
    if result.returncode != 0:
        raise CommandError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def apply_ruleset(ruleset: Ruleset) -> None:
    """Make the kernel match ruleset: new sets, one transaction per family, old sets go."""
    run_command(["ipset", "restore"], ruleset.ipset_restore_text())
    for family in FAMILIES:
        saved = parse_saved_filter_table(run_command([SAVE_COMMAND[family], "-t", "filter"]))
        hooks = [
            command
            for builtin in HOOKS
            for command in hook_commands(builtin, saved.rules.get(builtin, ()))
        ]
        text = ruleset.iptables_restore_text(
            family, stale_chains=saved.our_chains(), hook_commands=hooks
        )
        run_command([RESTORE_COMMAND[family], "-w", "--noflush"], text)
    leftovers = destroy_sets(keep={ipset.name for ipset in ruleset.ipsets})
    if leftovers:
        # The kernel may release a set a moment after the rules that used it; next sync retries.
        log.debug("ipsets still in use, will retry: %s", ", ".join(leftovers))


def destroy_sets(keep: Collection[str]) -> list[str]:
    """Destroy our sets except keep; returns the ones the kernel would not let go of yet."""
    leftovers = []
    for name in run_command(["ipset", "list", "-n"]).split():
        if not is_our_set(name) or name in keep:
            continue
        try:
            run_command(["ipset", "destroy", name])
        except CommandError:
            leftovers.append(name)
    return leftovers


def cleanup(attempts: int = 20, delay_seconds: float = 0.1) -> None:
    """Remove every hook, chain and set of ours (both families)."""
    for family in FAMILIES:
        saved = parse_saved_filter_table(run_command([SAVE_COMMAND[family], "-t", "filter"]))
        text = cleanup_restore_text(saved)
        if text is not None:
            run_command([RESTORE_COMMAND[family], "-w", "--noflush"], text)
    for _ in range(attempts):
        leftovers = destroy_sets(keep=())
        if not leftovers:
            return
        time.sleep(delay_seconds)
    raise CommandError(f"ipsets still in use after cleanup: {', '.join(leftovers)}")


def node_addresses() -> frozenset[IPv4Address]:
    """Every IPv4 address configured on this host (node IP, bridge gateway, loopback)."""
    interfaces = json.loads(run_command(["ip", "-j", "-4", "address", "show"]) or "[]")
    addresses = set()
    for interface in interfaces:
        for info in interface.get("addr_info") or []:
            if info.get("family") == "inet" and info.get("local"):
                addresses.add(IPv4Address(info["local"]))
    return frozenset(addresses)


def ensure_bridge_netfilter() -> None:
    """Bridged traffic must go through iptables, or pod-to-pod rules never see a packet."""
    for path in BRIDGE_NETFILTER_SYSCTLS:
        if not path.exists():
            raise CommandError(f"{path} is missing: br_netfilter is not available")
        if path.read_text().strip() != "1":
            log.warning("setting %s to 1", path)
            path.write_text("1\n")
