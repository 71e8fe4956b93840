"""The SDK's own frozen dataclasses and their conversion from and to protobuf.

Money stays `decimal.Decimal` (the wire carries decimal strings, never floats);
instants are integer microseconds since the epoch with a `datetime` property
(None when the instant is unset, i.e. 0 on the wire).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from kestrel_sdk.budget import budget
from kestrel_sdk.budget import unspent as budget_unspent
from kestrel_sdk.v1 import common_pb2, gateway_pb2, meter_pb2


def _dt(us: int) -> datetime | None:
    return datetime.fromtimestamp(us / 1e6, tz=UTC) if us else None


def _dec(text: str) -> Decimal:
    """Wire decimal string to Decimal; empty means zero."""
    try:
        return Decimal(text) if text else Decimal(0)
    except InvalidOperation:
        raise ValueError(f"the server sent {text!r}, which is not a decimal") from None


def money_text(value: Decimal | str | int) -> str:
    """A money argument as the wire's decimal string; floats are refused (inexact)."""
    if isinstance(value, bool | float):
        raise TypeError("pass money as decimal.Decimal or str, not float")
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, int):
        return str(value)
    if not value.is_finite():
        raise ValueError(f"{value} is not a finite amount")
    return format(value, "f")


class JobState(enum.StrEnum):
    """Lifecycle of a job (kestrel.v1.JobState without the prefix)."""

    UNSPECIFIED = "UNSPECIFIED"
    HELD = "HELD"
    ADMITTED = "ADMITTED"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EVICTED = "EVICTED"
    REJECTED = "REJECTED"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @classmethod
    def parse(cls, value: JobState | str | int) -> JobState:
        """From a JobState, a name ('running', 'JOB_STATE_RUNNING') or the proto number."""
        if isinstance(value, JobState):
            return value
        if isinstance(value, int):
            return cls.from_pb(value)
        name = value.strip().upper().removeprefix("JOB_STATE_")
        try:
            return cls[name]
        except KeyError:
            known = ", ".join(s.value.lower() for s in cls if s is not cls.UNSPECIFIED)
            raise ValueError(f"unknown job state {value!r}; known: {known}") from None

    @classmethod
    def from_pb(cls, value: int) -> JobState:
        try:
            name = common_pb2.JobState.Name(value)  # type: ignore[arg-type]
        except ValueError:
            return cls.UNSPECIFIED
        return cls[name.removeprefix("JOB_STATE_")]

    def to_pb(self) -> int:
        return int(common_pb2.JobState.Value(f"JOB_STATE_{self.value}"))


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                       JobState.EVICTED, JobState.REJECTED})


@dataclasses.dataclass(frozen=True)
class Runway:
    """A tenant's budget as the meter computed it from ledger rows."""

    tenant: str
    credits: Decimal
    charged: Decimal
    reserved: Decimal
    remaining: Decimal
    burn_per_s: Decimal
    # Seconds the unreserved money (remaining) lasts at the current burn: 0 once
    # everything is reserved, even while the money lasts (see money_runway_s).
    # None when nothing burns (unlimited).
    runway_s: float | None
    unlimited: bool
    running_gpus: int
    as_of_us: int
    ledger_seq: int
    remaining_bp: int
    # Seconds the money (credits - charged) lasts at the current burn; reservations
    # spend nothing. None when nothing burns (unlimited); 0 when the money is spent.
    money_runway_s: float | None = None
    # What new jobs can still reserve: remaining, never below zero.
    free_to_reserve: Decimal = Decimal(0)

    @property
    def as_of(self) -> datetime | None:
        return _dt(self.as_of_us)

    @property
    def unspent(self) -> Decimal:
        """credits - charged: the money not yet spent, reserved or not."""
        return budget_unspent(self.credits, self.charged)

    @classmethod
    def from_pb(cls, m: common_pb2.Runway) -> Runway:
        unlimited = bool(m.unlimited)
        runway_s = None if unlimited or not math.isfinite(m.runway_s) else float(m.runway_s)
        credits, charged, reserved = _dec(m.credits), _dec(m.charged), _dec(m.reserved)
        burn = _dec(m.burn_per_s)
        if m.free_to_reserve:  # the server computed both
            free, money_s = _dec(m.free_to_reserve), float(m.money_runway_s)
        else:  # a server from before they existed: the same computation here
            b = budget(credits, charged, reserved, burn)
            free, money_s = b.free_to_reserve, b.money_runway_s
        money_runway_s = None if unlimited or not math.isfinite(money_s) else money_s
        return cls(tenant=m.tenant, credits=credits, charged=charged,
                   reserved=reserved, remaining=_dec(m.remaining),
                   burn_per_s=burn, runway_s=runway_s, unlimited=unlimited,
                   running_gpus=m.running_gpus, as_of_us=m.as_of_us, ledger_seq=m.ledger_seq,
                   remaining_bp=m.remaining_bp, money_runway_s=money_runway_s,
                   free_to_reserve=free)


@dataclasses.dataclass(frozen=True)
class Tenant:
    tenant: str
    display_name: str
    gpu_quota: Mapping[str, int]
    rate_per_s: float
    burst: int
    suspended: bool
    created_us: int
    # Filled by get_tenant/create_tenant; list_tenants leaves it None.
    runway: Runway | None = None
    # GPUs per flavor it may borrow beyond gpu_quota (none: the quota is a cap).
    gpu_borrow: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def created_at(self) -> datetime | None:
        return _dt(self.created_us)

    @classmethod
    def from_pb(cls, m: gateway_pb2.Tenant, runway: common_pb2.Runway | None = None) -> Tenant:
        return cls(tenant=m.tenant, display_name=m.display_name,
                   gpu_quota=dict(sorted(m.gpu_quota.items())),
                   rate_per_s=m.rate_limit.per_s, burst=m.rate_limit.burst,
                   suspended=m.suspended, created_us=m.created_us,
                   runway=Runway.from_pb(runway) if runway is not None else None,
                   gpu_borrow=dict(sorted(m.gpu_borrow.items())))


@dataclasses.dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant: str
    name: str
    created_us: int
    revoked_us: int

    @property
    def revoked(self) -> bool:
        return self.revoked_us != 0

    @property
    def created_at(self) -> datetime | None:
        return _dt(self.created_us)

    @property
    def revoked_at(self) -> datetime | None:
        return _dt(self.revoked_us)

    @classmethod
    def from_pb(cls, m: gateway_pb2.ApiKey) -> ApiKey:
        return cls(key_id=m.key_id, tenant=m.tenant, name=m.name, created_us=m.created_us,
                   revoked_us=m.revoked_us)


@dataclasses.dataclass(frozen=True)
class ApiKeyCreated:
    """A new key. `secret` is shown once by the server and never again; keep it safe."""

    key_id: str
    secret: str = dataclasses.field(repr=False)
    tenant: str
    name: str
    created_us: int

    @property
    def created_at(self) -> datetime | None:
        return _dt(self.created_us)

    @classmethod
    def from_pb(cls, m: gateway_pb2.CreateApiKeyResponse) -> ApiKeyCreated:
        return cls(key_id=m.key.key_id, secret=m.secret, tenant=m.key.tenant, name=m.key.name,
                   created_us=m.key.created_us)


@dataclasses.dataclass(frozen=True)
class TopUpResult:
    # False when a top-up with the same id was already applied (nothing changed).
    applied: bool
    runway: Runway


@dataclasses.dataclass(frozen=True)
class JobSpec:
    name: str
    gpus: int
    max_duration_s: int
    flavor: str = ""
    image: str = ""
    command: tuple[str, ...] = ()
    priority: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    sim_duration_s: int = 0
    # Set by the platform on a replica of this endpoint (read only: never submitted).
    endpoint_id: str = ""

    @classmethod
    def from_pb(cls, m: common_pb2.JobSpec) -> JobSpec:
        return cls(name=m.name, gpus=m.gpus, max_duration_s=m.max_duration_s, flavor=m.flavor,
                   image=m.image, command=tuple(m.command), priority=m.priority,
                   labels=dict(sorted(m.labels.items())), sim_duration_s=m.sim_duration_s,
                   endpoint_id=m.endpoint_id)

    def to_pb(self) -> common_pb2.JobSpec:
        return common_pb2.JobSpec(name=self.name, gpus=self.gpus,
                                  max_duration_s=self.max_duration_s, flavor=self.flavor,
                                  image=self.image, command=list(self.command),
                                  priority=self.priority, labels=dict(self.labels),
                                  sim_duration_s=self.sim_duration_s)


@dataclasses.dataclass(frozen=True)
class Job:
    job_id: str
    tenant: str
    spec: JobSpec
    state: JobState
    reason: str
    flavor: str
    flavor_reason: str
    reserved: Decimal
    created_us: int
    admitted_us: int
    started_us: int
    finished_us: int
    idempotency_key: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def created_at(self) -> datetime | None:
        return _dt(self.created_us)

    @property
    def admitted_at(self) -> datetime | None:
        return _dt(self.admitted_us)

    @property
    def started_at(self) -> datetime | None:
        return _dt(self.started_us)

    @property
    def finished_at(self) -> datetime | None:
        return _dt(self.finished_us)

    @classmethod
    def from_pb(cls, m: common_pb2.Job) -> Job:
        return cls(job_id=m.job_id, tenant=m.tenant, spec=JobSpec.from_pb(m.spec),
                   state=JobState.from_pb(m.state), reason=m.reason, flavor=m.flavor,
                   flavor_reason=m.flavor_reason, reserved=_dec(m.reserved),
                   created_us=m.created_us, admitted_us=m.admitted_us,
                   started_us=m.started_us, finished_us=m.finished_us,
                   idempotency_key=m.idempotency_key)


@dataclasses.dataclass(frozen=True)
class UsageRow:
    """One ledger row: `gpus` held over [start_us, end_us), costing `cost` credits."""

    row_id: int
    tenant: str
    workload_id: str
    flavor: str
    gpus: int
    start_us: int
    end_us: int
    gpu_us: int
    price_per_gpu_s: Decimal
    cost: Decimal
    cause_id: str
    recorded_us: int

    @property
    def start(self) -> datetime | None:
        return _dt(self.start_us)

    @property
    def end(self) -> datetime | None:
        return _dt(self.end_us)

    @property
    def recorded_at(self) -> datetime | None:
        return _dt(self.recorded_us)

    @classmethod
    def from_pb(cls, m: meter_pb2.UsageRow) -> UsageRow:
        return cls(row_id=m.row_id, tenant=m.tenant, workload_id=m.workload_id,
                   flavor=m.flavor, gpus=m.gpus, start_us=m.start_us, end_us=m.end_us,
                   gpu_us=m.gpu_us, price_per_gpu_s=_dec(m.price_per_gpu_s),
                   cost=_dec(m.cost), cause_id=m.cause_id, recorded_us=m.recorded_us)


# --- requests -------------------------------------------------------------------------


def create_tenant_request(tenant: str, *, display_name: str, gpu_quota: Mapping[str, int],
                          rate_per_s: float, burst: int,
                          initial_credits: Decimal | str | int,
                          gpu_borrow: Mapping[str, int] | None = None
                          ) -> gateway_pb2.CreateTenantRequest:
    return gateway_pb2.CreateTenantRequest(
        tenant=gateway_pb2.Tenant(tenant=tenant, display_name=display_name,
                                  gpu_quota=dict(gpu_quota), gpu_borrow=dict(gpu_borrow or {}),
                                  rate_limit=gateway_pb2.RateLimit(per_s=rate_per_s,
                                                                   burst=burst)),
        initial_credits=money_text(initial_credits))


def submit_job_request(*, name: str, gpus: int, max_duration_s: int, flavor: str = "",
                       image: str = "", command: Iterable[str] = (), priority: int = 0,
                       labels: Mapping[str, str] | None = None, sim_duration_s: int = 0,
                       idempotency_key: str = "") -> gateway_pb2.SubmitJobRequest:
    if isinstance(command, str):
        raise TypeError("command is a sequence of arguments, not one string")
    spec = JobSpec(name=name, gpus=gpus, max_duration_s=max_duration_s, flavor=flavor,
                   image=image, command=tuple(command), priority=priority,
                   labels=dict(labels or {}), sim_duration_s=sim_duration_s)
    return gateway_pb2.SubmitJobRequest(spec=spec.to_pb(), idempotency_key=idempotency_key)


def list_jobs_request(states: Iterable[JobState | str | int], page_size: int,
                      page_token: str) -> gateway_pb2.ListJobsRequest:
    return gateway_pb2.ListJobsRequest(
        states=[JobState.parse(s).to_pb() for s in states],  # type: ignore[misc]
        page_size=page_size, page_token=page_token)


def list_all_jobs_request(tenant: str, states: Iterable[JobState | str | int],
                          page_size: int) -> gateway_pb2.ListAllJobsRequest:
    return gateway_pb2.ListAllJobsRequest(
        tenant=tenant, states=[JobState.parse(s).to_pb() for s in states],  # type: ignore[misc]
        page_size=page_size)


# --- JSON ---------------------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    """Dataclasses (and lists of them) as JSON-ready values: Decimal as exact strings,
    enums by name, mappings and tuples as objects and lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value if isinstance(value.value, str) else value.name
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value
