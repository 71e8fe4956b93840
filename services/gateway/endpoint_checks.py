"""Field checks of the endpoint RPCs (pure): each problem is a field violation."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from kestrel.endpoints import ENDPOINT_ID_RE, MAX_TEXTS, MODEL_NAME, Priority
from kestrel.errors import Violations
from kestrel.workloads import CPU_FLAVOR
from kestrel_sdk.money import parse_amount
from kestrel_sdk.v1 import common_pb2, gateway_pb2
from services.gateway.validation import name_problem

MAX_REPLICAS = 16
MAX_TIMEOUT_MS = 60_000
DEFAULT_TIMEOUT_S = 10.0


def check_endpoint_id(v: Violations, endpoint_id: str) -> None:
    if not ENDPOINT_ID_RE.match(endpoint_id):
        v.add("endpoint_id", "must look like ep-<16 hex digits>")


def check_endpoint_spec(v: Violations, spec: common_pb2.EndpointSpec,
                        flavors: Collection[str], max_node_gpus: int) -> None:
    if (p := name_problem(spec.name)) is not None:
        v.add("spec.name", p)
    if spec.model not in ("", MODEL_NAME):
        v.add("spec.model", f"must be {MODEL_NAME!r} (the one model workers serve) or empty")
    if spec.flavor not in ("", CPU_FLAVOR, *flavors):
        v.add("spec.flavor", f"must be empty, {CPU_FLAVOR!r} or a known GPU flavor")
    known = (CPU_FLAVOR, *flavors)
    for i, f in enumerate(spec.flavors):
        if f not in known:
            v.add(f"spec.flavors[{i}]", f"unknown flavor {f[:64]!r}; known: "
                                        f"{', '.join(sorted(known))}")
        elif f in spec.flavors[:i]:
            v.add(f"spec.flavors[{i}]", f"{f} is named twice")
    if len(spec.flavors) > len(known):
        v.add("spec.flavors", f"at most {len(known)} flavors")
    if spec.missed_slo_value_per_s:
        try:
            parse_amount(spec.missed_slo_value_per_s, positive=False)
        except ValueError as exc:
            v.add("spec.missed_slo_value_per_s", str(exc))
    if not 0 <= spec.gpus_per_replica <= max_node_gpus:
        v.add("spec.gpus_per_replica", f"must be between 0 and {max_node_gpus}")
    for name in ("min_replicas", "max_replicas", "warm_pool"):
        if not 0 <= getattr(spec, name) <= MAX_REPLICAS:
            v.add(f"spec.{name}", f"must be between 0 and {MAX_REPLICAS}")
    if spec.max_replicas and spec.min_replicas > spec.max_replicas:
        v.add("spec.min_replicas", "must not exceed max_replicas")
    for name, limit in (("target_queue_depth", 100_000), ("target_p95_ms", 600_000),
                        ("cooldown_s", 86_400), ("reservation_horizon_s", 30 * 86_400)):
        if not 0 <= getattr(spec, name) <= limit:
            v.add(f"spec.{name}", f"must be between 0 and {limit}")


def flavors_of(spec: common_pb2.EndpointSpec) -> tuple[str, ...]:
    """Every flavor its replicas may run on, its own first."""
    return (spec.flavor or CPU_FLAVOR, *(f for f in spec.flavors if f != spec.flavor))


def check_flavor_replicas(v: Violations, spec: common_pb2.EndpointSpec, replicas: int,
                          by_flavor: Mapping[str, int]) -> None:
    """A ScaleEndpoint's per-flavor counts: flavors the endpoint may run on, each
    0..max_replicas, `replicas` 0 or their sum."""
    allowed = flavors_of(spec)
    for f, n in sorted(by_flavor.items()):
        if f not in allowed:
            v.add(f"flavor_replicas[{f[:64]!r}]",
                  f"the endpoint may run on {', '.join(allowed)} only")
        elif not 0 <= n <= spec.max_replicas:
            v.add(f"flavor_replicas[{f}]",
                  f"must be 0..{spec.max_replicas} (the endpoint's max)")
    if replicas and replicas != sum(by_flavor.values()):
        v.add("replicas", "must be 0 or the sum of flavor_replicas")


def normalised_spec(spec: common_pb2.EndpointSpec) -> common_pb2.EndpointSpec:
    out = common_pb2.EndpointSpec()
    out.CopyFrom(spec)
    out.model = spec.model or MODEL_NAME
    out.flavor = spec.flavor or CPU_FLAVOR
    # The other flavors, each once, the endpoint's own left out.
    del out.flavors[:]
    out.flavors.extend(dict.fromkeys(f for f in spec.flavors if f != out.flavor))
    out.max_replicas = spec.max_replicas or max(1, spec.min_replicas)
    return out


def check_infer(request: gateway_pb2.InferRequest, remaining_s: float | None) -> tuple[
        Priority, float]:
    """The request's priority and how long to wait for it (a little inside the call's own
    gRPC deadline, so the answer is ours, with its reason, not the transport's)."""
    v = Violations()
    check_endpoint_id(v, request.endpoint_id)
    if not 1 <= len(request.inputs) <= MAX_TEXTS:
        v.add("inputs", f"must hold between 1 and {MAX_TEXTS} texts (got "
                        f"{len(request.inputs)})")
    if request.priority not in {0, *(int(p) for p in Priority)}:
        v.add("priority", "is not a known priority")
    if not 0 <= request.timeout_ms <= MAX_TIMEOUT_MS:
        v.add("timeout_ms", f"must be between 0 (the call's deadline) and {MAX_TIMEOUT_MS}")
    v.raise_if_any()
    timeout = request.timeout_ms / 1000 if request.timeout_ms else DEFAULT_TIMEOUT_S
    if remaining_s is not None:
        timeout = min(timeout, remaining_s - min(0.05, remaining_s * 0.1))
    return Priority.of_wire(request.priority), max(timeout, 0.001)
