"""The runway check's feed of Workloads from the placer to admission (kestrel.checkfeed),
and the two ends that use it, without NATS or Kubernetes."""

from __future__ import annotations

import asyncio
from typing import Any

from kestrel import checkfeed
from kestrel.checkfeed import Inbox, Outbox
from kestrel_sdk.v1 import events_pb2
from services.admission.kueue import RunwayCheckController
from services.placer.kube import WORKLOADS
from services.placer.observer import CHECK_BEAT, CHECK_SYNC

CHECK = "kestrel-runway"


def workload(name: str, state: str = "Pending", check: str = CHECK, admitted: bool = False,
             rv: str = "1", tenant: str = "acme") -> dict[str, Any]:
    conds = [{"type": "Admitted", "status": "True"}] if admitted else []
    return {"metadata": {"namespace": f"kestrel-{tenant}", "name": name, "resourceVersion": rv,
                         "ownerReferences": [{"kind": "Job", "name": name.removeprefix("job-")}]},
            "spec": {"podSets": [{"template": {"metadata": {
                "labels": {"kestrel.dev/tenant": tenant}}}}]},
            "status": {"admissionChecks": [{"name": check, "state": state}],
                       "conditions": conds}}


def names(msg: events_pb2.CheckedWorkloads) -> list[str]:
    return [w.name for w in msg.workloads]


def test_a_change_the_check_does_not_read_is_not_forwarded() -> None:
    out = Outbox(CHECK, epoch="e")
    out.note(workload("job-a"), deleted=False)
    first = out.take()
    assert first is not None and names(first) == ["job-a"] and first.seq == 1
    out.note(workload("job-a", rv="2"), deleted=False)  # e.g. Kueue's requeue stamp moved
    assert out.take() is None
    out.note(workload("job-a", state="Ready", rv="3"), deleted=False)
    then = out.take()
    assert then is not None and then.seq == 2 and then.workloads[0].check_state == "Ready"


def test_a_workload_without_our_check_is_never_forwarded_and_its_deletion_neither() -> None:
    out = Outbox(CHECK, epoch="e")
    out.note(workload("job-x", check="someone-elses"), deleted=False)
    out.note(workload("job-x", check="someone-elses"), deleted=True)
    assert out.take() is None and out.seq == 0


def test_a_deleted_workload_is_forwarded_as_gone_once() -> None:
    out = Outbox(CHECK, epoch="e")
    out.note(workload("job-a"), deleted=False)
    out.take()
    out.note(workload("job-a"), deleted=True)
    gone = out.take()
    assert gone is not None and list(gone.gone) == ["kestrel-acme/job-a"] and not gone.workloads
    out.note(workload("job-a"), deleted=True)
    assert out.take() is None


def test_changes_between_two_takes_go_out_once_as_they_are_last() -> None:
    out = Outbox(CHECK, epoch="e")
    out.note(workload("job-a"), deleted=False)
    out.note(workload("job-a", state="Ready"), deleted=False)
    out.note(workload("job-b"), deleted=False)
    msg = out.take()
    assert msg is not None and [(w.name, w.check_state) for w in msg.workloads] == [
        ("job-a", "Ready"), ("job-b", "Pending")]


def test_a_full_set_is_a_reset_then_its_continuation_in_numbered_parts(monkeypatch: Any
                                                                         ) -> None:
    monkeypatch.setattr(checkfeed, "CHUNK", 2)
    out = Outbox(CHECK, epoch="e")
    parts = list(out.full([workload(f"job-{i}") for i in range(5)]))
    assert [(p.seq, p.reset, len(p.workloads)) for p in parts] == [
        (1, True, 2), (2, False, 2), (3, False, 1)]
    inbox = Inbox()
    for p in parts:
        inbox.accept(p)
    assert sorted(inbox.views) == [f"kestrel-acme/job-{i}" for i in range(5)] and inbox.whole


def test_an_empty_full_set_still_resets_what_admission_holds() -> None:
    inbox = Inbox()
    inbox.accept(next(Outbox(CHECK, epoch="old").full([workload("job-a")])))
    parts = list(Outbox(CHECK, epoch="new").full([]))
    assert [(p.seq, p.reset) for p in parts] == [(1, True)]
    inbox.accept(parts[0])
    assert inbox.views == {} and inbox.whole


def test_a_full_set_without_a_list_is_what_was_sent_with_what_is_due() -> None:
    out = Outbox(CHECK, epoch="e")
    out.note(workload("job-a"), deleted=False)
    out.take()
    out.note(workload("job-b"), deleted=False)
    out.note(workload("job-a"), deleted=True)
    (part,) = out.full()
    assert part.reset and names(part) == ["job-b"] and out.take() is None


def test_admission_asks_for_a_full_set_until_one_comes_and_again_after_a_gap() -> None:
    out, inbox = Outbox(CHECK, epoch="e"), Inbox()
    out.note(workload("job-a"), deleted=False)
    assert inbox.accept(out.take())[2]  # type: ignore[arg-type]  # nothing whole yet
    for part in out.full():
        assert not inbox.accept(part)[2]
    out.note(workload("job-b"), deleted=False)
    assert not inbox.accept(out.take())[2]  # type: ignore[arg-type]
    out.note(workload("job-c"), deleted=False)
    out.take()  # lost on the way
    out.note(workload("job-a"), deleted=True)
    changed, gone, ask = inbox.accept(out.take())  # type: ignore[arg-type]
    assert ask and gone == ["kestrel-acme/job-a"] and changed == []
    assert "kestrel-acme/job-c" not in inbox.views  # what the full set asked for mends
    for part in out.full():
        inbox.accept(part)
    assert sorted(inbox.views) == ["kestrel-acme/job-b", "kestrel-acme/job-c"] and inbox.whole


def test_a_restarted_placer_is_a_new_epoch_that_asks_unless_it_begins_with_a_reset() -> None:
    inbox = Inbox()
    for part in Outbox(CHECK, epoch="one").full([workload("job-a")]):
        inbox.accept(part)
    again = Outbox(CHECK, epoch="two")
    again.note(workload("job-b"), deleted=False)
    assert inbox.accept(again.take())[2]  # type: ignore[arg-type]
    for part in Outbox(CHECK, epoch="three").full([workload("job-c")]):
        assert not inbox.accept(part)[2]
    assert list(inbox.views) == ["kestrel-acme/job-c"]


def test_the_controller_decides_what_the_feed_changed_and_everything_after_a_reset() -> None:
    rc = RunwayCheckController(None, "", CHECK)  # type: ignore[arg-type]
    out = Outbox(CHECK, epoch="e")
    for part in out.full([workload("job-a"), workload("job-b")]):
        assert not rc.received(part)
    assert rc.dirty == {"kestrel-acme/job-a", "kestrel-acme/job-b"} and rc.changed.is_set()
    rc.dirty.clear()
    out.note(workload("job-b", state="Ready"), deleted=False)
    assert not rc.received(out.take())  # type: ignore[arg-type]
    assert rc.dirty == {"kestrel-acme/job-b"}
    assert rc.views["kestrel-acme/job-b"].check_state == "Ready"


def test_admission_asks_at_most_once_a_second() -> None:
    asked: list[str] = []

    async def sync(reason: str) -> None:
        asked.append(reason)

    async def main() -> None:
        rc = RunwayCheckController(None, "", CHECK)  # type: ignore[arg-type]
        rc.sync = sync
        await rc.ask_full("start")
        await rc.ask_full("a gap")
        rc.asked_at -= 1.0
        await rc.ask_full("another gap")

    asyncio.run(main())
    assert asked == ["start", "another gap"]


class Placer:
    """What the placer's observer does with Workload reads and a sync request."""

    @staticmethod
    def make() -> Any:
        from services.placer.core import Placer as Real
        from services.placer.settings import PlacerSettings

        placer = Real(None, None, None, PlacerSettings())  # type: ignore[arg-type]
        sent: list[events_pb2.CheckedWorkloads] = []

        async def publish_checks(msgs: list[events_pb2.CheckedWorkloads]) -> None:
            sent.extend(msgs)

        placer.observer.publish_checks = publish_checks
        return placer, sent


def test_the_placer_forwards_its_first_list_then_changes_and_a_full_set_when_asked() -> None:
    placer, sent = Placer.make()

    async def main() -> None:
        await placer.observer.observe([(CHECK_SYNC, [])])  # before any list: the list will answer
        assert sent == []
        await placer.observer.observe([(WORKLOADS, [("RELIST", [workload("job-a")])])])
        await placer.observer.observe([(WORKLOADS, [("MODIFIED", workload("job-a", state="Ready")),
                                           ("ADDED", workload("job-b"))])])
        await placer.observer.observe([(CHECK_SYNC, [])])

    asyncio.run(main())
    assert [(m.seq, m.reset, names(m)) for m in sent] == [
        (1, True, ["job-a"]), (2, False, ["job-a", "job-b"]), (3, True, ["job-a", "job-b"])]
    inbox = Inbox()
    assert not any(inbox.accept(m)[2] for m in sent)
    assert inbox.views["kestrel-acme/job-a"].check_state == "Ready"


def test_a_message_lost_on_a_quiet_cluster_is_found_at_the_next_beat() -> None:
    placer, sent = Placer.make()

    async def main() -> None:
        await placer.observer.observe([(CHECK_BEAT, [])])  # nothing listed yet: nothing to number
        await placer.observer.observe([(WORKLOADS, [("RELIST", [])])])
        await placer.observer.observe([(WORKLOADS, [("ADDED", workload("job-a"))])])
        await placer.observer.observe([(CHECK_BEAT, [])])
        await placer.observer.observe([(WORKLOADS, [("ADDED", workload("job-b"))]),
                              (CHECK_BEAT, [])])  # a change goes out: no beat beside it

    asyncio.run(main())
    assert [(m.seq, m.reset, names(m)) for m in sent] == [
        (1, True, []), (2, False, ["job-a"]), (3, False, []), (4, False, ["job-b"])]
    inbox = Inbox()
    inbox.accept(sent[0])
    # The change is lost; nothing else changes; the beat shows the gap.
    assert inbox.accept(sent[2])[2]


def test_admission_answers_garbage_on_the_feed_by_asking_for_a_full_set() -> None:
    """Core NATS has no dead letters: an unusable message is logged, nothing held is
    touched, and a full set is asked for, which mends whatever it was."""
    from services.admission.app import follow_checks

    class Msg:
        def __init__(self, data: bytes, headers: dict[str, str] | None = None) -> None:
            self.data, self.headers = data, headers

    class Nats:
        def __init__(self) -> None:
            self.cb: Any = None
            self.asked: list[str] = []

        async def subscribe(self, subject: str, cb: Any) -> None:
            assert subject == checkfeed.SUBJECT
            self.cb = cb

        async def publish(self, subject: str, data: bytes, headers: Any = None) -> None:
            assert subject == checkfeed.SYNC_SUBJECT
            self.asked.append(events_pb2.CheckSyncRequest.FromString(data).reason)

    async def main() -> tuple[Nats, RunwayCheckController]:
        nc, rc = Nats(), RunwayCheckController(None, "", CHECK)  # type: ignore[arg-type]
        await follow_checks(nc, rc)  # type: ignore[arg-type]
        for part in Outbox(CHECK, epoch="e").full([workload("job-a")]):
            await nc.cb(Msg(part.SerializeToString(),
                            {"Kestrel-Type": "kestrel.v1.CheckedWorkloads"}))
        rc.asked_at -= 1.0
        await nc.cb(Msg(b"\xff\xfe not a message"))
        rc.asked_at -= 1.0
        await nc.cb(Msg(b"", {"Kestrel-Type": "kestrel.v1.RunwayChanged"}))
        return nc, rc

    nc, rc = asyncio.run(main())
    assert nc.asked == ["admission started", "an unusable message", "an unusable message"]
    assert list(rc.views) == ["kestrel-acme/job-a"]
