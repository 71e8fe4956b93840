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


# Query parameters as the apiserver spells them (what the typed client passes).
QUERY = {"label_selector": "labelSelector", "field_selector": "fieldSelector",
         "resource_version": "resourceVersion",
         "timeout_seconds": "timeoutSeconds", "allow_watch_bookmarks": "allowWatchBookmarks",
         "watch": "watch"}


def call(api: Any, method: str, path: str, body: Any = None,
         content_type: str = "application/json", **query: Any) -> Any:
    """One call by its path; the urllib3 response, unread; ApiException on a status
    outside 2xx.

    The typed APIs (CoreV1Api, CustomObjectsApi) are not used where calls are many:
    each call goes through pydantic's validate_call and the client's option handling
    first (160 us of CPU more per PATCH than this, measured against the real apiserver:
    975 vs 814 us), and importing CoreV1Api with its models cost 0.9 s of CPU."""
    from kubernetes.client.exceptions import ApiException

    # Options for the client itself (_preload_content, ...) are not query parameters;
    # any other name not in QUERY is a caller's mistake and raises KeyError.
    params = [(QUERY[k], str(v).lower() if isinstance(v, bool) else v)
              for k, v in query.items() if not k.startswith("_") and v is not None]
    request = api.param_serialize(
        method, path, query_params=params, body=body,
        header_params={"Accept": "application/json", "Content-Type": content_type},
        auth_settings=["BearerToken"])
    resp = api.call_api(*request)
    if not 200 <= resp.status <= 299:
        resp.read()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


def send(api: Any, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> bytes:
    """`call` for a write whose answer is read whole and the connection given back to
    the pool (one left with its body unread is not reused)."""
    resp = call(api, method, path, body, content_type)
    try:
        data: bytes = resp.read()
        return data
    finally:
        resp.release_conn()
