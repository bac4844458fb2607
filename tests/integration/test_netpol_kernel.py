"""The generated rules in a real kernel: packets between network namespaces.

Everything happens inside namespaces this test creates (snp-test-*), so the
host's own iptables, ipsets and interfaces are never touched. The "node" is a
namespace holding the bridge cni0 (10.244.0.1/24), the node address
198.18.0.2, kube-proxy-like DNAT for two service IPs, and a route to an
"external" namespace (198.51.100.0/24). Pods are namespaces on the bridge.
Needs root, iproute2, iptables (nf_tables), ipset and conntrack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandpod_testkit.apiserver import PrivateApiServer, require_kube_bin_dir
from sandpod_testkit.paths import REPO_ROOT
from sandpod_testkit.processes import ChildProcess
from sandpod_testkit.waiting import wait_until

TOOLS = ("ip", "iptables-restore", "ip6tables-restore", "ipset", "conntrack")

NODE_IP = "198.18.0.2"
GATEWAY = "10.244.0.1"
API_SERVICE = "10.96.0.1"
DNS_SERVICE = "10.96.0.10"
EXT_ALLOWED, EXT_EXCEPTED = "198.51.100.10", "198.51.100.20"
PODS = {"a": "10.244.0.10", "b": "10.244.0.11", "c": "10.244.0.12", "d": "10.244.0.13"}
LABELS = {"a": {"app": "client"}, "b": {"app": "web"}, "c": {"app": "other"}}
B_PORTS = [{"name": "http", "containerPort": 8080}, {"name": "alt", "containerPort": 9090}]


def _can_make_namespaces() -> bool:
    if os.geteuid() != 0 or any(shutil.which(tool) is None for tool in TOOLS):
        return False
    probe = f"snp-test-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


@pytest.fixture(autouse=True, scope="module")
def _require_network_namespaces() -> None:
    if not _can_make_namespaces():
        pytest.fail("needs root, network namespaces and iptables/ipset tools")


SERVER = textwrap.dedent(
    """
    import socket, sys, threading
    def tcp(port):
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port)); s.listen(64)
        while True:
            c, _ = s.accept(); c.sendall(b"ok"); c.close()
    def udp(port, address):
        # Bound to one address, as CoreDNS is, so replies leave from the address asked.
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((address, port))
        while True:
            _, peer = s.recvfrom(100); s.sendto(b"ok", peer)
    for spec in sys.argv[1:]:
        proto_port, _, address = spec.partition("@")
        proto, port = proto_port.split("/")
        if proto == "tcp":
            threading.Thread(target=tcp, args=(int(port),)).start()
        else:
            threading.Thread(target=udp, args=(int(port), address or "0.0.0.0")).start()
    print("ready", flush=True)
    """
)

CLIENT = textwrap.dedent(
    """
    import socket, sys
    proto, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
    address = socket.getaddrinfo(host, port, family, kind)[0][4]
    s = socket.socket(family, kind); s.settimeout(1.0)
    try:
        s.connect(address)
        if proto == "tcp-connect":  # a server that speaks first only after TLS
            sys.exit(0)
        if proto == "udp":
            s.send(b"ping")
        sys.exit(0 if s.recv(10) == b"ok" else 1)
    except ConnectionRefusedError:
        sys.exit(2)
    except OSError:
        sys.exit(1)
    """
)

APPLY = textwrap.dedent(
    """
    import json, sys
    from ipaddress import IPv4Network
    from sandpod_netpol import kernel
    from sandpod_netpol.rules import build_ruleset
    from sandpod_netpol.selection import NodeInfo
    data = json.load(sys.stdin)
    node = NodeInfo("node-1", IPv4Network("10.244.0.0/24"), "cni0", kernel.node_addresses())
    ruleset = build_ruleset(
        policies=data["policies"], pods=data["pods"], namespaces=data["namespaces"], node=node
    )
    kernel.apply_ruleset(ruleset)
    print(json.dumps(sorted(ipset.name for ipset in ruleset.ipsets)))
    """
)


def sh(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env)
    assert result.returncode == 0, f"{' '.join(argv)}: {result.stderr}"
    return result.stdout


class Lab:
    def __init__(self, tag: str) -> None:
        suffix = f"{tag}{os.getpid()}"
        self.node = f"snp-test-node-{suffix}"
        self.ext = f"snp-test-ext-{suffix}"
        self.pods = {name: f"snp-test-{name}-{suffix}" for name in PODS}
        self.servers: list[subprocess.Popen[str]] = []
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "hack" / "cluster")}

    def in_ns(self, namespace: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", namespace, *argv]

    def add_veth(self, host_side: str, namespace: str) -> None:
        """A veth pair: `host_side` in the node, its peer eth0 in `namespace`."""
        sh(
            "ip",
            "-n",
            self.node,
            "link",
            "add",
            host_side,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
        )

    def build(self, *, fake_api_server: bool = True) -> None:
        node = self.node
        for namespace in [node, self.ext, *self.pods.values()]:
            sh("ip", "netns", "add", namespace)
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
        for key in (
            "net.ipv4.ip_forward",
            "net.bridge.bridge-nf-call-iptables",
            "net.bridge.bridge-nf-call-ip6tables",
        ):
            sh(*self.in_ns(node, "sysctl", "-qw", f"{key}=1"))
        # The kernel answers at most ~1 ICMP error a second per host after a short burst;
        # these tests provoke many in a row and check each is a fast refusal.
        sh(*self.in_ns(node, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"))
        sh("ip", "-n", node, "link", "add", "cni0", "type", "bridge")
        sh("ip", "-n", node, "addr", "add", f"{GATEWAY}/24", "dev", "cni0")
        sh("ip", "-n", node, "link", "set", "cni0", "up")
        sh("ip", "-n", node, "addr", "add", f"{NODE_IP}/32", "dev", "lo")
        for name, namespace in self.pods.items():
            host_side = f"veth-{name}"
            self.add_veth(host_side, namespace)
            sh("ip", "-n", node, "link", "set", host_side, "master", "cni0", "up")
            sh(*self.in_ns(namespace, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0"))
            sh("ip", "-n", namespace, "addr", "add", f"{PODS[name]}/24", "dev", "eth0")
            sh("ip", "-n", namespace, "link", "set", "eth0", "up")
            sh("ip", "-n", namespace, "route", "add", "default", "via", GATEWAY)
        self.add_veth("ext0", self.ext)
        sh("ip", "-n", node, "addr", "add", "198.51.100.1/24", "dev", "ext0")
        sh("ip", "-n", node, "link", "set", "ext0", "up")
        for address in (EXT_ALLOWED, EXT_EXCEPTED):
            sh("ip", "-n", self.ext, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", self.ext, "link", "set", "eth0", "up")
        sh("ip", "-n", self.ext, "route", "add", "default", "via", "198.51.100.1")
        # What kube-proxy does for the API server and cluster DNS services.
        dnat = "-j DNAT --to-destination"
        nat = [
            "*nat",
            f"-A PREROUTING -d {API_SERVICE}/32 -p tcp --dport 443 {dnat} {NODE_IP}:6443",
            f"-A PREROUTING -d {DNS_SERVICE}/32 -p udp --dport 53 {dnat} {NODE_IP}:53",
            "COMMIT",
        ]
        sh(*self.in_ns(node, "iptables-restore", "--noflush"), stdin="\n".join(nat) + "\n")
        self.serve(node, *(["tcp/6443"] if fake_api_server else []), f"udp/53@{NODE_IP}")
        self.serve(self.ext, "tcp/443")
        self.serve(self.pods["a"], "tcp/8080")
        self.serve(self.pods["b"], "tcp/8080", "tcp/9090", "udp/5353")
        self.serve(self.pods["d"], "tcp/8080")

    def serve(self, namespace: str, *ports: str) -> None:
        server = subprocess.Popen(
            self.in_ns(namespace, sys.executable, "-c", SERVER, *ports),
            stdout=subprocess.PIPE,
            text=True,
        )
        self.servers.append(server)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"

    def teardown(self) -> None:
        for server in self.servers:
            server.kill()
            server.wait()
        for namespace in [self.node, self.ext, *self.pods.values()]:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

    def outcome(self, source: str, proto: str, host: str, port: int) -> str:
        """What a client in pod `source` (or "node") gets from host:port within a second."""
        namespace = self.node if source == "node" else self.pods[source]
        client = self.in_ns(namespace, sys.executable, "-c", CLIENT, proto, host, str(port))
        code = subprocess.run(client, capture_output=True).returncode
        return {0: "ok", 2: "refused"}.get(code, "no answer")

    def reaches(self, source: str, proto: str, host: str, port: int) -> bool:
        return self.outcome(source, proto, host, port) == "ok"

    def apply(self, policies: list[dict[str, Any]], known_pods: str = "abc") -> list[str]:
        pods = [
            {
                "metadata": {"namespace": "default", "name": name, "labels": LABELS.get(name, {})},
                "spec": {
                    "nodeName": "node-1",
                    "containers": [{"name": "main", "ports": B_PORTS if name == "b" else []}],
                },
                "status": {"phase": "Running", "podIP": PODS[name]},
            }
            for name in known_pods
        ]
        data = {"policies": policies, "pods": pods, "namespaces": []}
        output = subprocess.run(
            self.in_ns(self.node, sys.executable, "-c", APPLY),
            input=json.dumps(data),
            capture_output=True,
            text=True,
            env=self.env,
        )
        assert output.returncode == 0, output.stderr
        # Each scenario starts without connections remembered from the previous one.
        subprocess.run(self.in_ns(self.node, "conntrack", "-F"), capture_output=True)
        return list(json.loads(output.stdout))

    def cleanup(self) -> None:
        sh(*self.in_ns(self.node, sys.executable, "-m", "sandpod_netpol", "cleanup"), env=self.env)

    def saved(self, family: int = 4) -> str:
        return sh(*self.in_ns(self.node, "iptables-save" if family == 4 else "ip6tables-save"))

    def sets(self) -> list[str]:
        return sh(*self.in_ns(self.node, "ipset", "list", "-n")).split()

    def link_local(self, namespace: str, device: str) -> str:
        out = sh("ip", "-n", namespace, "-6", "-o", "addr", "show", "dev", device, "scope", "link")
        return out.split()[3].split("/")[0]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab("k")
    try:
        lab.build()
        yield lab
    finally:
        lab.teardown()


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "default", "name": name}, "spec": spec}


DENY_INGRESS = policy("deny-ingress", {"podSelector": {}, "policyTypes": ["Ingress"]})
CLIENT_EGRESS_DENY = policy(
    "client-egress", {"podSelector": {"matchLabels": {"app": "client"}}, "policyTypes": ["Egress"]}
)


def test_without_policies_every_flow_works(lab: Lab) -> None:
    lab.apply([])
    assert lab.reaches("a", "tcp", PODS["b"], 8080)
    assert lab.reaches("a", "udp", PODS["b"], 5353)
    assert lab.reaches("a", "tcp", NODE_IP, 6443)
    assert lab.reaches("a", "tcp", API_SERVICE, 443)
    assert lab.reaches("a", "udp", DNS_SERVICE, 53)
    assert lab.reaches("a", "tcp", EXT_ALLOWED, 443)


def test_deny_all_ingress(lab: Lab) -> None:
    lab.apply([DENY_INGRESS])
    assert lab.outcome("a", "tcp", PODS["b"], 8080) == "refused"
    assert lab.outcome("b", "tcp", PODS["a"], 8080) == "refused"
    assert lab.outcome("a", "udp", PODS["b"], 5353) == "refused"
    assert lab.reaches("node", "tcp", PODS["b"], 8080)  # kubelet probes
    assert lab.reaches("b", "tcp", EXT_ALLOWED, 443)  # egress untouched, replies come back
    assert lab.reaches("b", "udp", DNS_SERVICE, 53)


def test_ingress_from_labelled_pods_on_a_named_port(lab: Lab) -> None:
    allow = policy(
        "web",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                    "ports": [{"port": "http"}],
                }
            ],
        },
    )
    lab.apply([allow])
    assert lab.reaches("a", "tcp", PODS["b"], 8080)
    assert not lab.reaches("a", "tcp", PODS["b"], 9090)
    assert not lab.reaches("c", "tcp", PODS["b"], 8080)
    assert lab.reaches("b", "tcp", PODS["a"], 8080)  # a is not isolated


def test_end_port_range(lab: Lab) -> None:
    ranged = policy(
        "range",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"ports": [{"port": 8000, "endPort": 8100}]}],
        },
    )
    lab.apply([ranged])
    assert lab.reaches("a", "tcp", PODS["b"], 8080)
    assert not lab.reaches("a", "tcp", PODS["b"], 9090)


def test_deny_all_egress_cuts_off_dns_and_the_api_server(lab: Lab) -> None:
    lab.apply([CLIENT_EGRESS_DENY])
    # Refused at once, through the service DNAT too, not left to time out.
    assert lab.outcome("a", "udp", DNS_SERVICE, 53) == "refused"
    assert lab.outcome("a", "tcp", API_SERVICE, 443) == "refused"
    assert lab.outcome("a", "tcp", NODE_IP, 6443) == "refused"
    assert lab.outcome("a", "tcp", GATEWAY, 6443) == "refused"
    assert lab.outcome("a", "tcp", PODS["b"], 8080) == "refused"
    assert lab.outcome("a", "tcp", EXT_ALLOWED, 443) == "refused"
    assert lab.reaches("b", "tcp", PODS["a"], 8080)  # a's replies to incoming connections flow
    assert lab.reaches("c", "tcp", NODE_IP, 6443)  # other pods are not selected


def test_egress_ip_blocks_with_except_and_dns_on_the_node(lab: Lab) -> None:
    egress = policy(
        "egress",
        {
            "podSelector": {"matchLabels": {"app": "client"}},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [
                        {"ipBlock": {"cidr": "198.51.100.0/24", "except": [f"{EXT_EXCEPTED}/32"]}}
                    ],
                    "ports": [{"port": 443}],
                },
                {
                    "to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}],
                    "ports": [{"port": 53, "protocol": "UDP"}],
                },
            ],
        },
    )
    lab.apply([egress])
    assert lab.reaches("a", "tcp", EXT_ALLOWED, 443)
    assert not lab.reaches("a", "tcp", EXT_EXCEPTED, 443)
    assert lab.reaches("a", "udp", DNS_SERVICE, 53)
    assert not lab.reaches("a", "tcp", API_SERVICE, 443)


def test_pod_addresses_the_enforcer_does_not_know_are_cut_off(lab: Lab) -> None:
    lab.apply([])  # pod d exists on the bridge but not in the API's view
    assert lab.outcome("d", "tcp", PODS["a"], 8080) == "no answer"  # dropped, not refused
    assert not lab.reaches("a", "tcp", PODS["d"], 8080)
    assert not lab.reaches("d", "udp", DNS_SERVICE, 53)
    assert lab.reaches("node", "tcp", PODS["d"], 8080)
    lab.apply([], known_pods="abcd")
    assert lab.reaches("d", "tcp", PODS["a"], 8080)


def test_ipv6_link_local_paths_are_closed(lab: Lab) -> None:
    b_v6 = f"{lab.link_local(lab.pods['b'], 'eth0')}%eth0"
    node_v6 = f"{lab.link_local(lab.node, 'cni0')}%eth0"
    lab.cleanup()
    assert lab.reaches("a", "tcp", b_v6, 8080)  # the hole exists without our rules
    assert lab.reaches("a", "tcp", node_v6, 6443)
    lab.apply([])
    assert not lab.reaches("a", "tcp", b_v6, 8080)
    assert not lab.reaches("a", "tcp", node_v6, 6443)
    assert lab.reaches("a", "tcp", PODS["b"], 8080)


# A FORWARD rule of another program's, which ours must keep below our hook and leave alone.
SOMEONE_ELSES_RULE = ("-m", "comment", "--comment", "someone-else", "-j", "ACCEPT")


def test_reapply_keeps_one_hook_on_top_and_drops_stale_sets(lab: Lab) -> None:
    lab.apply([DENY_INGRESS])
    sh(*lab.in_ns(lab.node, "iptables", "-I", "FORWARD", "1", *SOMEONE_ELSES_RULE))
    wanted = lab.apply([CLIENT_EGRESS_DENY])
    forward = [line for line in lab.saved().splitlines() if line.startswith("-A FORWARD")]
    assert forward[0] == "-A FORWARD -m comment --comment sandpod-netpol -j SANDPOD-NP-FORWARD"
    assert sum("SANDPOD-NP-FORWARD" in line for line in forward) == 1
    assert "someone-else" in forward[1]
    assert "SANDPOD-NP-I-" not in lab.saved()  # the deny-ingress chains are gone
    lab.apply([CLIENT_EGRESS_DENY])  # sets released late by the kernel go on the next pass
    deadline = time.monotonic() + 5
    while sorted(name for name in lab.sets() if name.startswith("SANDPOD-NP-")) != wanted:
        assert time.monotonic() < deadline, lab.sets()
        time.sleep(0.1)
        lab.apply([CLIENT_EGRESS_DENY])
    sh(*lab.in_ns(lab.node, "iptables", "-D", "FORWARD", *SOMEONE_ELSES_RULE))


def test_cleanup_removes_every_trace(lab: Lab) -> None:
    lab.apply([DENY_INGRESS, CLIENT_EGRESS_DENY])
    lab.cleanup()
    assert "SANDPOD-NP" not in lab.saved(4)
    assert "SANDPOD-NP" not in lab.saved(6)
    assert not [name for name in lab.sets() if name.startswith("SANDPOD-NP")]
    assert "DNAT" in lab.saved(4)  # other rules stay
    lab.cleanup()  # twice is fine


# --- the enforcer process, the CNI plugin and a real API server -------------------------------
#
# A private etcd + kube-apiserver (the local cluster's build; required) runs
# inside a second lab's node namespace, with no scheduler or kubelet: pods are bound to
# "node-1" and never start, and their addresses come only from CNI ADDs, as they do for a
# pod whose status the kubelet has not reported yet.

PLUGIN = REPO_ROOT / "hack" / "cluster" / "sandpod_netpol" / "cni_plugin.py"


class Cluster(PrivateApiServer):
    """etcd, kube-apiserver and the enforcer inside lab.node; the plugin run as containerd would."""

    def __init__(self, lab: Lab, bin_dir: Path, workdir: Path) -> None:
        super().__init__(
            bin_dir,
            workdir,
            address=NODE_IP,
            api_port=6443,
            service_cidr="10.96.0.0/16",
            wrap=lambda argv: lab.in_ns(lab.node, *argv),
        )
        self.lab = lab
        self.socket = workdir / "netpol.sock"
        self.enforcer: ChildProcess | None = None
        self.enforcer_log = workdir / "enforcer.log"
        self.syncs = 0

    def start(self) -> None:
        super().start()
        wait_until(
            lambda: self.kubectl_ok("create", "serviceaccount", "default"),
            timeout=30,
            what="service account",
        )
        self.start_enforcer()

    def start_enforcer(self) -> None:
        command = self.lab.in_ns(
            self.lab.node,
            sys.executable,
            "-m",
            "sandpod_netpol",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node-name",
            "node-1",
            "--pod-cidr",
            "10.244.0.0/24",
            "--socket",
            str(self.socket),
            "--resync-seconds",
            "2",
        )
        self.enforcer = ChildProcess("the enforcer", command, self.lab.env, self.enforcer_log)
        self.enforcer.spawn()
        self.syncs += 1
        self.enforcer.wait_ready(
            lambda: self.enforcer_log.read_text().count("synced with the API server") >= self.syncs,
            timeout=30,
            what="enforcer synced",
        )

    def stop_enforcer(self) -> None:
        assert self.enforcer is not None and self.enforcer.process is not None
        self.enforcer.process.terminate()
        assert self.enforcer.process.wait(timeout=10) == 0
        self.enforcer = None

    def stop(self) -> None:
        if self.enforcer is not None:
            self.enforcer.stop()
        super().stop()

    def cni(
        self, command: str, pod: str, ip: str | None = None, container_id: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the plugin executable as containerd would, chained after the bridge plugin."""
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "sandpod",
            "type": "sandpod-netpol",
            "socket": str(self.socket),
            "timeoutSeconds": 10,
        }
        if ip is not None:
            conf["prevResult"] = prev_result(ip)
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id or f"sandbox-{pod}",
            "CNI_NETNS": f"/var/run/netns/{self.lab.pods.get(pod, pod)}",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/usr/lib/cni",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
            f"K8S_POD_INFRA_CONTAINER_ID={container_id or f'sandbox-{pod}'}",
        }
        return subprocess.run(
            [str(PLUGIN)], input=json.dumps(conf), env=env, capture_output=True, text=True
        )


def prev_result(ip: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:02", "sandbox": "/var/run/netns/x"},
        ],
        "ips": [{"address": f"{ip}/24", "gateway": GATEWAY, "interface": 1}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }


def pod_object(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {
            "nodeName": "node-1",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/never-pulled",
                    "ports": B_PORTS if name == "b" else [],
                }
            ],
        },
    }


def policy_object(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", **policy(name, spec)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    bin_dir = require_kube_bin_dir()
    lab = Lab("e")
    cluster = Cluster(lab, bin_dir, tmp_path_factory.mktemp("netpol-cluster"))
    try:
        lab.build(fake_api_server=False)
        cluster.start()
        cluster.apply(*(pod_object(name, LABELS[name]) for name in "abc"))
        yield cluster
    finally:
        cluster.stop()
        subprocess.run(
            lab.in_ns(lab.node, sys.executable, "-m", "sandpod_netpol", "cleanup"),
            env=lab.env,
            capture_output=True,
        )
        lab.teardown()


def deny_ingress(cluster: Cluster) -> None:
    """Applies DENY_INGRESS through the API and waits until it cuts a off from b."""
    cluster.apply(policy_object("deny-ingress", DENY_INGRESS["spec"]))
    wait_until(
        lambda: not cluster.lab.reaches("a", "tcp", PODS["b"], 8080),
        timeout=5,
        what="deny-all ingress",
    )


def test_cni_version(cluster: Cluster) -> None:
    result = cluster.cni("VERSION", "a")
    assert result.returncode == 0
    assert "1.0.0" in json.loads(result.stdout)["supportedVersions"]


def test_pods_are_cut_off_until_their_cni_add_and_reachable_right_after(cluster: Cluster) -> None:
    lab = cluster.lab
    assert not lab.reaches("a", "tcp", PODS["b"], 8080)  # not set up through the plugin yet
    for name in "abc":
        result = cluster.cni("ADD", name, PODS[name])
        assert result.returncode == 0, result.stdout + result.stderr
        assert json.loads(result.stdout) == prev_result(PODS[name])
    # No waiting: ADD returned only once the rules knew the pods.
    assert lab.reaches("a", "tcp", PODS["b"], 8080)
    assert lab.reaches("b", "udp", DNS_SERVICE, 53)
    assert lab.reaches("b", "tcp-connect", API_SERVICE, 443)
    assert cluster.cni("CHECK", "a", PODS["a"]).returncode == 0


def test_policies_take_effect_within_seconds(cluster: Cluster) -> None:
    lab = cluster.lab
    deny_ingress(cluster)
    assert lab.reaches("node", "tcp", PODS["b"], 8080)
    cluster.kubectl("delete", "networkpolicy", "deny-ingress")
    wait_until(lambda: lab.reaches("a", "tcp", PODS["b"], 8080), timeout=5, what="policy deleted")


def test_label_changes_move_pods_in_and_out_of_policies(cluster: Cluster) -> None:
    lab = cluster.lab
    cluster.apply(
        policy_object(
            "web-from-clients",
            {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}],
            },
        )
    )
    wait_until(lambda: not lab.reaches("c", "tcp", PODS["b"], 8080), timeout=5, what="c shut out")
    assert lab.reaches("a", "tcp", PODS["b"], 9090)
    cluster.kubectl("label", "pod", "c", "app=client", "--overwrite")
    wait_until(
        lambda: lab.reaches("c", "tcp", PODS["b"], 8080), timeout=5, what="c relabelled as client"
    )
    cluster.kubectl("label", "pod", "c", "app=other", "--overwrite")
    cluster.kubectl("delete", "networkpolicy", "web-from-clients")


def test_a_new_sandbox_pod_is_isolated_from_its_first_packet(cluster: Cluster) -> None:
    lab = cluster.lab
    cluster.apply(
        policy_object(
            "sandbox",
            {
                "podSelector": {"matchLabels": {"app": "sandbox"}},
                "policyTypes": ["Ingress", "Egress"],
            },
        ),
        pod_object("d", {"app": "sandbox"}),
    )
    result = cluster.cni("ADD", "d", PODS["d"])  # right away: the watch may not have caught up
    assert result.returncode == 0, result.stdout + result.stderr
    assert not lab.reaches("d", "udp", DNS_SERVICE, 53)
    assert not lab.reaches("d", "tcp-connect", API_SERVICE, 443)
    assert not lab.reaches("d", "tcp-connect", NODE_IP, 6443)
    assert not lab.reaches("d", "tcp", PODS["a"], 8080)
    assert not lab.reaches("d", "tcp", EXT_ALLOWED, 443)
    assert not lab.reaches("a", "tcp", PODS["d"], 8080)
    assert lab.reaches("node", "tcp", PODS["d"], 8080)


def test_add_for_a_pod_the_api_does_not_know_fails(cluster: Cluster) -> None:
    result = cluster.cni("ADD", "ghost", "10.244.0.50")
    assert result.returncode == 1
    error = json.loads(result.stdout)
    assert error["code"] == 11
    assert "ghost" in error["details"]


def test_del_forgets_the_address(cluster: Cluster) -> None:
    lab = cluster.lab
    assert cluster.cni("DEL", "d", container_id="an-older-sandbox").returncode == 0
    assert cluster.cni("CHECK", "d", PODS["d"]).returncode == 0  # a stale DEL changes nothing
    result = cluster.cni("DEL", "d")
    assert result.returncode == 0 and result.stdout == ""
    cluster.kubectl("label", "pod", "d", "app=open", "--overwrite")
    wait_until(
        lambda: cluster.cni("CHECK", "d", PODS["d"]).returncode == 1, timeout=5, what="d forgotten"
    )
    assert not lab.reaches("d", "tcp", PODS["a"], 8080)  # unknown address, even unpoliced


def test_rules_outlive_the_enforcer_and_come_back_from_its_state(cluster: Cluster) -> None:
    lab = cluster.lab
    deny_ingress(cluster)
    cluster.stop_enforcer()
    assert not lab.reaches("a", "tcp", PODS["b"], 8080)  # still enforced while it is down
    refused = cluster.cni("ADD", "a", PODS["a"])
    assert refused.returncode == 1 and json.loads(refused.stdout)["code"] == 11
    assert cluster.cni("DEL", "ghost").returncode == 0  # teardown never blocks
    cluster.kubectl("delete", "networkpolicy", "deny-ingress")
    cluster.start_enforcer()
    # The pods have no status IP: only the saved CNI attachments know their addresses.
    wait_until(
        lambda: lab.reaches("a", "tcp", PODS["b"], 8080),
        timeout=5,
        what="policy gone after restart",
    )
    assert cluster.cni("CHECK", "b", PODS["b"]).returncode == 0
