"""Which kubeconfig settings a service can make a Kubernetes client from, and a call
by its path (kestrel.kubeclient.call/send) against a loopback HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from kubernetes.client.exceptions import ApiException

from kestrel import kubeclient
from kestrel.kubeclient import IN_CLUSTER, kubeconfig_usable


def test_in_cluster_needs_the_apiserver_address_a_pod_is_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not kubeconfig_usable(IN_CLUSTER)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    assert kubeconfig_usable(IN_CLUSTER)


def test_a_kubeconfig_path_is_usable_only_when_the_file_exists(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    assert not kubeconfig_usable(str(path))
    assert not kubeconfig_usable("")
    path.write_text("apiVersion: v1\nkind: Config\n")
    assert kubeconfig_usable(str(path))


class Apiserver(BaseHTTPRequestHandler):
    """Answers like the apiserver: 200 with the object, 422 when a JSON Patch's test
    fails; keeps connections alive (HTTP/1.1)."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, str, Any]]] = []

    def do_PATCH(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Apiserver.seen.append((self.command, self.path, self.headers["Content-Type"], body))
        code = 422 if "refuse" in self.path else 200
        out = json.dumps({"kind": "Status", "code": code} if code != 200 else
                         {"metadata": {"name": "w"}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_write_by_its_path_is_sent_as_given_read_whole_and_its_connection_reused() -> None:
    from kubernetes import client as k8s

    server = ThreadingHTTPServer(("127.0.0.1", 0), Apiserver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
        api = k8s.ApiClient(cfg)
        ops = [{"op": "test", "path": "/status/admissionChecks/0/name", "value": "c"}]
        for _ in range(3):
            got = kubeclient.send(api, "PATCH", "/apis/g/v1/namespaces/n/workloads/w/status",
                                  ops, "application/json-patch+json")
            assert json.loads(got) == {"metadata": {"name": "w"}}
        with pytest.raises(ApiException) as refused:
            kubeclient.send(api, "PATCH", "/apis/g/v1/namespaces/n/workloads/refuse/status",
                            ops, "application/json-patch+json")
        assert refused.value.status == 422
        assert Apiserver.seen[0] == ("PATCH", "/apis/g/v1/namespaces/n/workloads/w/status",
                                     "application/json-patch+json", ops)
        pools = api.rest_client.pool_manager.pools
        pool = pools[next(iter(pools.keys()))]
        assert pool.num_requests == 4 and pool.num_connections == 1  # each read, given back
    finally:
        server.shutdown()
        server.server_close()
