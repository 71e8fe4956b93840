"""The cluster the end-to-end tests share: brought up once per session (or reused when
it is up already) and taken down at the end unless it was up before or
KESTREL_KEEP_CLUSTER=1."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kestrel_tools import cluster as kc


@pytest.fixture(scope="session")
def cluster_up() -> Iterator[kc.ClusterInfo]:
    was_up = kc.is_up()
    yield kc.ensure_cluster()
    if not was_up and os.environ.get("KESTREL_KEEP_CLUSTER") != "1":
        kc.cluster_down()


@pytest.fixture(scope="session")
def api(cluster_up: kc.ClusterInfo) -> object:
    """A kubernetes ApiClient for the cluster (admin kubeconfig)."""
    return kc.api_client()
