"""A small NetworkPolicy enforcer for sandpod's local single-node cluster.

It runs as a root process on the node, watches pods, namespaces and
NetworkPolicies, and programs iptables chains and ipsets (prefix SANDPOD-NP) so
that pods on the node's CNI bridge obey networking.k8s.io/v1 NetworkPolicy.
A chained CNI plugin (cni_plugin.py) makes pod network setup wait until the new
pod's rules are in place, so no pod ever runs unpoliced.
"""
