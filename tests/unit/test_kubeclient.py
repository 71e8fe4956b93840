"""Which kubeconfig settings a service can make a Kubernetes client from."""

from __future__ import annotations

from pathlib import Path

import pytest

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
