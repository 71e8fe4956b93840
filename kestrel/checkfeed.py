"""The runway check's feed of Workloads: the placer watches, admission decides.

Kueue's Workloads are watched by one Kestrel process, the placer. Admission's runway
check needs only a few fields of each (its entry in status.admissionChecks, three
conditions, the owner Job and the tenant), so the placer forwards those, and only
when they change, on core NATS (`kestrel.checks.workloads`). A second Workload watch
in admission cost the apiserver about 7 CPU-ms per admitted job (README, "one extra
Workload watch, measured"): the apiserver encodes and writes every Workload event
once per watcher, about ten per job.

Order and loss: the messages of one placer run (`epoch`) are numbered. Admission
applies every message; a gap, an unknown epoch or a start asks the placer for a
full set (`kestrel.checks.sync`), which drops what admission held. The placer also
sends a full set after each full list of Workloads (its start, a 410 Gone), and an
empty numbered message every few seconds (`beat`), so a loss shows even when nothing
follows it.

Pure data: the placer's `Outbox` and admission's `Inbox` hold no I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kestrel.workloads import TENANT_LABEL
from kestrel_sdk.v1 import events_pb2

SUBJECT = "kestrel.checks.workloads"
SYNC_SUBJECT = "kestrel.checks.sync"
# Workloads per message of a full set: about 200 bytes each, well under NATS's 1 MiB.
CHUNK = 1000


@dataclass(frozen=True)
class WorkloadView:
    namespace: str
    name: str
    job_id: str  # the owning Job's name; "" when not a Kestrel job
    check_state: str  # our entry in status.admissionChecks ("" when absent)
    check_message: str
    admitted: bool  # Admitted condition True
    active: bool  # spec.active
    finished: bool
    check_index: int = 0  # position of our entry in status.admissionChecks
    tenant: str = ""  # the kestrel.dev/tenant label of its pod template

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def view(obj: Mapping[str, Any], check: str) -> WorkloadView | None:
    """The parts of a Workload the check decides on; None when our check is not on it."""
    status = obj.get("status") or {}
    entries = status.get("admissionChecks") or []
    index = next((i for i, c in enumerate(entries) if c.get("name") == check), None)
    if index is None:
        return None
    entry = entries[index]
    meta = obj.get("metadata") or {}
    owner = next((o.get("name", "") for o in meta.get("ownerReferences") or []
                  if o.get("kind") == "Job"), "")
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    spec = obj.get("spec") or {}
    tenant = next((str(labels[TENANT_LABEL]) for ps in spec.get("podSets") or []
                   if TENANT_LABEL in (labels := ((ps.get("template") or {}).get("metadata")
                                                  or {}).get("labels") or {})), "")
    return WorkloadView(meta.get("namespace", ""), meta.get("name", ""), owner,
                        entry.get("state", ""), entry.get("message", ""),
                        conds.get("Admitted") == "True",
                        spec.get("active", True) is not False,
                        conds.get("Finished") == "True", index, tenant)


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def to_wire(v: WorkloadView) -> events_pb2.CheckedWorkload:
    return events_pb2.CheckedWorkload(
        namespace=v.namespace, name=v.name, job_id=v.job_id, check_state=v.check_state,
        check_message=v.check_message, admitted=v.admitted, active=v.active,
        finished=v.finished, check_index=v.check_index, tenant=v.tenant)


def from_wire(w: events_pb2.CheckedWorkload) -> WorkloadView:
    return WorkloadView(w.namespace, w.name, w.job_id, w.check_state, w.check_message,
                        w.admitted, w.active, w.finished, w.check_index, w.tenant)


class Outbox:
    """The placer's side: what admission was last told of each Workload, and what
    changed since. `note` each watched change; `take` the message to send, if any;
    `full` after a full list, or when admission asks."""

    def __init__(self, check: str, epoch: str | None = None) -> None:
        self.check = check
        self.epoch = epoch or uuid.uuid4().hex[:12]
        self.seq = 0
        self.sent: dict[str, WorkloadView] = {}  # as admission was told
        self.due: dict[str, WorkloadView | None] = {}  # None: gone

    def note(self, obj: Mapping[str, Any], deleted: bool) -> None:
        key = key_of(obj)
        now = None if deleted else view(obj, self.check)
        if now == self.sent.get(key):
            self.due.pop(key, None)
            return
        self.due[key] = now

    def take(self) -> events_pb2.CheckedWorkloads | None:
        if not self.due:
            return None
        msg = self._next(reset=False)
        for key, now in self.due.items():
            if now is None:
                if self.sent.pop(key, None) is not None:
                    msg.gone.append(key)
            else:
                self.sent[key] = now
                msg.workloads.append(to_wire(now))
        self.due.clear()
        if not msg.workloads and not msg.gone:
            self.seq -= 1  # nothing to say after all: the number is not used
            return None
        return msg

    def beat(self) -> events_pb2.CheckedWorkloads:
        """A numbered message saying nothing: sent every few seconds, so that a message
        lost while nothing else follows it (a NATS restart on a quiet cluster) is found
        missing within that time, not at the next change."""
        return self._next(reset=False)

    def full(self, current: Iterable[Mapping[str, Any]] | None = None
             ) -> Iterator[events_pb2.CheckedWorkloads]:
        """Everything, as a reset then its continuation. With `current` (a full list),
        that replaces what was sent; without, what was sent stands, with what is due."""
        if current is not None:
            self.sent = {v.key: v for obj in current if (v := view(obj, self.check))}
            self.due.clear()
        else:
            for key, now in self.due.items():
                if now is None:
                    self.sent.pop(key, None)
                else:
                    self.sent[key] = now
            self.due.clear()
        views = list(self.sent.values())
        for at in range(0, max(len(views), 1), CHUNK):
            msg = self._next(reset=at == 0)
            msg.workloads.extend(to_wire(v) for v in views[at:at + CHUNK])
            yield msg

    def _next(self, reset: bool) -> events_pb2.CheckedWorkloads:
        self.seq += 1
        return events_pb2.CheckedWorkloads(epoch=self.epoch, seq=self.seq, reset=reset)


class Inbox:
    """Admission's side: the Workloads as the placer last said, and whether a message
    shows that something was missed (then ask for a full set)."""

    def __init__(self) -> None:
        self.views: dict[str, WorkloadView] = {}
        self.epoch = ""
        self.seq = 0
        self.whole = False  # a full set of the current epoch arrived, with nothing missed

    def accept(self, msg: events_pb2.CheckedWorkloads
               ) -> tuple[list[WorkloadView], list[str], bool]:
        """Apply one message: (views now held that it changed, keys it removed, whether
        a full set must be asked for). A message out of sequence is still applied:
        each carries whole views, and the full set asked for mends what it missed."""
        in_order = msg.epoch == self.epoch and msg.seq == self.seq + 1
        if msg.reset:
            self.views.clear()
            self.whole = True
        elif not in_order:
            self.whole = False
        self.epoch, self.seq = msg.epoch, msg.seq
        gone = [k for k in msg.gone if self.views.pop(k, None) is not None]
        changed = [from_wire(w) for w in msg.workloads]
        for v in changed:
            self.views[v.key] = v
        return changed, gone, not self.whole
