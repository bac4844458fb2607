"""The Kubernetes API client both the operator and the gateway open (kubernetes_asyncio)."""

from pathlib import Path

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config.config_exception import ConfigException


async def open_api_client(kubeconfig: Path | None = None) -> k8s.ApiClient:
    """An API client: the given kubeconfig, else in-cluster, else the default kubeconfig."""
    configuration = k8s.Configuration()
    if kubeconfig is not None:
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return k8s.ApiClient(configuration)
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except ConfigException:
        await k8s_config.load_kube_config(client_configuration=configuration, persist_config=False)
    return k8s.ApiClient(configuration)
