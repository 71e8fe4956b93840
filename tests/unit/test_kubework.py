"""kestrel.kubework's Job manifests (pure dicts, no cluster)."""

from __future__ import annotations

from kestrel import kubework


def test_a_gpu_job_left_to_kueue_selects_no_flavor() -> None:
    spec = kubework.gpu_job_manifest("j1", "ns", "gpu")["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec


def test_a_gpu_job_given_a_flavor_selects_only_that_flavors_nodes() -> None:
    body = kubework.gpu_job_manifest("j1", "ns", "gpu", flavor="gpu-a10")
    assert body["spec"]["suspend"] is True
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"kestrel.dev/flavor": "gpu-a10"}


def test_a_cpu_job_selects_the_cpu_pools_flavor() -> None:
    body = kubework.cpu_job_manifest("c1", "ns", "cpu", ["true"], image="img:1")
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"kestrel.dev/flavor": "cpu"}
