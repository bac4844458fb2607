"""What the test suites (tests/*) and the bench (benchmarks/) share to drive sandpod from the
outside: the repository's paths, waiting with a deadline, free ports and child processes,
the CRD and namespaces on a cluster, and a private etcd + kube-apiserver.

- paths: the repository root, the build cache, the CRD file, the local cluster's kubeconfig
- waiting: wait_until, polling with a deadline (never a fixed sleep)
- processes: free_port, http_ok, ChildProcess (a logged child that can be stopped or killed)
- kube: the CRD applied and served, namespaces ready for pods, executions cleaned up
- apiserver: PrivateApiServer, etcd and kube-apiserver from the local cluster's build
- expected: the agent tools and catalog languages several suites check for
- browser: Debian's Chromium through Playwright; the API docs rendered with other origins cut off
"""
