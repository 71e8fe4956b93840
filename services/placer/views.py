"""What an operator reads of the cluster: nodes and ClusterQueues as the apiserver's JSON
in, kestrel.v1 views out. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kestrel.workloads import POOL_LABEL, SIMULATED_LABEL, TENANT_LABEL
from kestrel_sdk.v1 import placer_pb2
from services.placer.lifecycle import FLAVOR_NODE_LABEL, GPU


def node_view(node: Mapping[str, Any]) -> placer_pb2.ClusterNode:
    labels = node.get("metadata", {}).get("labels") or {}
    status = node.get("status") or {}
    alloc = status.get("allocatable") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    try:
        gpus = int(alloc.get(GPU, "0"))
    except ValueError:
        gpus = 0
    return placer_pb2.ClusterNode(
        name=node.get("metadata", {}).get("name", ""), pool=labels.get(POOL_LABEL, ""),
        flavor=labels.get(FLAVOR_NODE_LABEL, ""),
        simulated=labels.get(SIMULATED_LABEL) == "true", ready=ready, gpus=gpus,
        cpu=str(alloc.get("cpu", "")), memory=str(alloc.get("memory", "")))


def _amounts(entries: list[Mapping[str, Any]] | None) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Kueue's status.flavorsReservation / flavorsUsage by (flavor, resource)."""
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for f in entries or []:
        for r in f.get("resources") or []:
            out[(f.get("name", ""), r.get("name", ""))] = r
    return out


def queue_view(cq: Mapping[str, Any]) -> placer_pb2.ClusterQueueView:
    meta, spec, status = cq.get("metadata") or {}, cq.get("spec") or {}, cq.get("status") or {}
    reserved = _amounts(status.get("flavorsReservation"))
    admitted = _amounts(status.get("flavorsUsage"))
    resources = []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                key = (flavor.get("name", ""), r.get("name", ""))
                res, adm = reserved.get(key, {}), admitted.get(key, {})
                resources.append(placer_pb2.QueueResourceUsage(
                    flavor=key[0], resource=key[1], nominal_quota=str(r.get("nominalQuota", "0")),
                    borrowing_limit=str(r.get("borrowingLimit", "")),
                    reserved=str(res.get("total", "0")), admitted=str(adm.get("total", "0")),
                    borrowed=str(res.get("borrowed", "0"))))
    return placer_pb2.ClusterQueueView(
        name=meta.get("name", ""), tenant=(meta.get("labels") or {}).get(TENANT_LABEL, ""),
        cohort=str(spec.get("cohortName") or spec.get("cohort") or ""), resources=resources,
        pending_workloads=int(status.get("pendingWorkloads") or 0),
        reserving_workloads=int(status.get("reservingWorkloads") or 0),
        admitted_workloads=int(status.get("admittedWorkloads") or 0),
        stop_policy=str(spec.get("stopPolicy") or "None"))
