"""A Kubernetes API client, shared by the services that talk to the apiserver (the
placer's watches and writes, admission's runway check, the autoscaler's Lease).

`kubeconfig` is a kubeconfig file's path, or `in-cluster` for a pod's own service
account (its token, refreshed as the kubelet rotates it, and the cluster's CA, from
/var/run/secrets/kubernetes.io/serviceaccount; the apiserver from
KUBERNETES_SERVICE_HOST/PORT)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

IN_CLUSTER = "in-cluster"


def kubeconfig_usable(kubeconfig: str) -> bool:
    """Whether `kubeconfig` names something a client can be made from."""
    if kubeconfig == IN_CLUSTER:
        return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    return bool(kubeconfig) and os.path.exists(kubeconfig)


def new_api_client(kubeconfig: str, pool: int = 32) -> Any:
    """A client whose connection pool holds `pool` connections: set before the pool
    exists, or every call beyond the default size pays a new TLS handshake."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    cfg = k8s.Configuration()
    if kubeconfig == IN_CLUSTER:
        incluster = cast(Callable[..., None], k8s_config.load_incluster_config)
        incluster(client_configuration=cfg)
    else:
        load = cast(Callable[..., None], k8s_config.load_kube_config)
        load(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return k8s.ApiClient(cfg)
