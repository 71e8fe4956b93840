"""Validation of public requests, pure: data in, field violations out."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from decimal import Decimal

from kestrel.errors import Violations
from kestrel_sdk.money import MoneyError, parse_amount
from kestrel_sdk.v1 import common_pb2, gateway_pb2

# \Z, not $: "$" also matches before a trailing newline, so "acme\n" passed as a name
# (newlines pass the generic string check, for notes). Found by the issue-17 fuzzer.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
# A tenant lives in namespace kestrel-<tenant>, which must fit Kubernetes' 63 characters.
TENANT_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,53}[a-z0-9])?\Z")
LABEL_KEY_RE = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?\Z")
ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}\Z")
JOB_ID_RE = re.compile(r"^job-[a-f0-9]{16}\Z")
MAX_DURATION_S = 7 * 86_400
MAX_LABELS = 32
# The slowest rate limit: one call per 1000 s. Slower ones (1e-300/s passed the old
# check) overflow the limiter's arithmetic in Redis and lock the tenant out.
MIN_RATE_PER_S = 0.001
MAX_RATE_PER_S = 100_000


def printable(text: str, limit: int) -> bool:
    return len(text) <= limit and all(c.isprintable() for c in text)


def name_problem(value: str) -> str | None:
    if not NAME_RE.match(value):
        return ("must be 1-63 characters of a-z, 0-9 and '-', starting and ending with a "
                "letter or digit")
    return None


def check_job_spec(v: Violations, spec: common_pb2.JobSpec, flavors: Collection[str],
                   max_node_gpus: int, prefix: str = "spec") -> None:
    if (p := name_problem(spec.name)) is not None:
        v.add(f"{prefix}.name", p)
    if not 1 <= spec.gpus <= max_node_gpus:
        v.add(f"{prefix}.gpus", f"must be a whole number between 1 and {max_node_gpus} "
                                "(the largest node)")
    if not 1 <= spec.max_duration_s <= MAX_DURATION_S:
        v.add(f"{prefix}.max_duration_s",
              f"is required: seconds between 1 and {MAX_DURATION_S} (7 days)")
    if spec.sim_duration_s < 0 or (spec.max_duration_s > 0
                                   and spec.sim_duration_s > spec.max_duration_s):
        v.add(f"{prefix}.sim_duration_s", "must be between 0 and max_duration_s")
    if spec.flavor and spec.flavor not in flavors:
        v.add(f"{prefix}.flavor", f"unknown flavor {spec.flavor[:64]!r}; known: "
                                  f"{', '.join(sorted(flavors)) or 'none'}")
    if not -1000 <= spec.priority <= 1000:
        v.add(f"{prefix}.priority", "must be between -1000 and 1000")
    if not printable(spec.image, 256):
        v.add(f"{prefix}.image", "must be at most 256 printable characters")
    if len(spec.command) > 64 or not all(printable(a, 1024) for a in spec.command):
        v.add(f"{prefix}.command", "at most 64 arguments of at most 1024 printable characters")
    check_labels(v, spec.labels, f"{prefix}.labels")


def check_labels(v: Violations, labels: Mapping[str, str], field: str) -> None:
    if len(labels) > MAX_LABELS:
        v.add(field, f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not LABEL_KEY_RE.match(key):
            v.add(f"{field}[{key[:64]!r}]", "keys are 1-63 characters of a-z 0-9 - _ .")
        elif not printable(value, 63):
            v.add(f"{field}[{key}]", "values are at most 63 printable characters")


def check_submit(req: gateway_pb2.SubmitJobRequest, flavors: Collection[str],
                 max_node_gpus: int) -> None:
    v = Violations()
    check_job_spec(v, req.spec, flavors, max_node_gpus)
    if req.spec.endpoint_id:
        v.add("spec.endpoint_id", "is set by the gateway for an endpoint's replicas; a job "
                                  "leaves it empty (see CreateEndpoint)")
    if req.idempotency_key and not ID_RE.match(req.idempotency_key):
        v.add("idempotency_key", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    v.raise_if_any()


def tenant_problem(value: str) -> str | None:
    if not TENANT_RE.match(value):
        return ("must be 1-55 characters of a-z, 0-9 and '-', starting and ending with a "
                "letter or digit (it names the namespace kestrel-<tenant>)")
    return None


def check_tenant(v: Violations, t: gateway_pb2.Tenant, flavors: Collection[str],
                 prefix: str = "tenant") -> None:
    if (p := tenant_problem(t.tenant)) is not None:
        v.add(f"{prefix}.tenant", p)
    if not printable(t.display_name, 100):
        v.add(f"{prefix}.display_name", "must be at most 100 printable characters")
    for name, gpus_of in (("gpu_quota", t.gpu_quota), ("gpu_borrow", t.gpu_borrow)):
        for flavor, gpus in gpus_of.items():
            if flavor not in flavors:
                v.add(f"{prefix}.{name}[{flavor[:64]!r}]", "unknown flavor")
            elif not 0 <= gpus <= 100_000:
                v.add(f"{prefix}.{name}[{flavor}]", "must be between 0 and 100000 GPUs")
    if t.HasField("rate_limit"):
        if not MIN_RATE_PER_S <= t.rate_limit.per_s <= MAX_RATE_PER_S:
            v.add(f"{prefix}.rate_limit.per_s",
                  f"must be between {MIN_RATE_PER_S} and {MAX_RATE_PER_S} calls per second")
        if not 1 <= t.rate_limit.burst <= 100_000:
            v.add(f"{prefix}.rate_limit.burst", "must be between 1 and 100000")


def check_amount(v: Violations, field: str, text: str, *, optional: bool) -> Decimal | None:
    if optional and not text:
        return None
    try:
        return parse_amount(text)
    except MoneyError as exc:
        v.add(field, str(exc))
        return None


def check_page(v: Violations, page_size: int, limit: int = 1000) -> int:
    if not 0 <= page_size <= limit:
        v.add("page_size", f"must be between 0 (default 100) and {limit}")
    return page_size or 100
