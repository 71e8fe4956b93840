"""A Kubernetes API client from a kubeconfig file, shared by the services that talk to
the apiserver (the placer's watches and writes, the autoscaler's Lease)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast


def new_api_client(kubeconfig: str, pool: int = 32) -> Any:
    """A client whose connection pool holds `pool` connections: set before the pool
    exists, or every call beyond the default size pays a new TLS handshake."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    cfg = k8s.Configuration()
    load = cast(Callable[..., None], k8s_config.load_kube_config)
    load(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return k8s.ApiClient(cfg)
