"""kestrel.kubewatch reading a watch stream: events split across chunks come out
whole, bookmarks pass, an ERROR event raises its status (410 Gone relists), a refused
watch raises, and the connection goes back to the pool closed however the read ends
(one left mid-stream would hand its unread bytes to the next request)."""

from __future__ import annotations

import json
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from kestrel import kubewatch


class Response:
    """The urllib3 response a list call returns with _preload_content=False."""

    def __init__(self, chunks: list[bytes], status: int = 200) -> None:
        self.chunks = chunks
        self.status = status
        self.reason = "Forbidden" if status == 403 else "OK"
        self.released = False
        self.closed = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        yield from self.chunks

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = self.closed  # pooled only once closed: nothing left unread


def events(call: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """kubewatch.bursts, one event at a time."""
    for burst in kubewatch.bursts(call, *args, **kwargs):
        yield from burst


def line(kind: str, name: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {"metadata": {"name": name,
                                                             "resourceVersion": rv}}}
                      ).encode() + b"\n"


def lister(resp: Response, seen: dict[str, Any]) -> Any:
    def call(*args: Any, **kwargs: Any) -> Response:
        seen.update(kwargs, args=args)
        return resp
    return call


def test_events_split_across_chunks_come_out_whole_in_order() -> None:
    data = line("ADDED", "a", "1") + line("MODIFIED", "a", "2") + line("BOOKMARK", "", "3")
    resp = Response([data[:7], data[7:50], data[50:51], data[51:]])
    seen: dict[str, Any] = {}
    got = list(events(lister(resp, seen), "g", resource_version="0", timeout_s=5))
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in got] == [
        ("ADDED", "1"), ("MODIFIED", "2"), ("BOOKMARK", "3")]
    assert seen["watch"] is True and seen["resource_version"] == "0"
    assert seen["timeout_seconds"] == 5 and seen["allow_watch_bookmarks"] is True
    assert seen["_preload_content"] is False and seen["args"] == ("g",)
    assert resp.released


def test_a_last_line_without_newline_is_still_an_event() -> None:
    resp = Response([line("ADDED", "a", "1").rstrip(b"\n")])
    got = list(events(lister(resp, {}), resource_version="0", timeout_s=5))
    assert [e["object"]["metadata"]["name"] for e in got] == ["a"]


def test_an_error_event_raises_its_status_so_a_410_relists() -> None:
    gone = json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "code": 410, "reason": "Expired",
        "message": "too old resource version: 1 (42)"}}).encode() + b"\n"
    resp = Response([line("ADDED", "a", "1") + gone + line("ADDED", "b", "2")])
    it = events(lister(resp, {}), resource_version="1", timeout_s=5)
    assert next(it)["type"] == "ADDED"
    with pytest.raises(ApiException) as err:
        next(it)
    assert err.value.status == 410 and "too old" in str(err.value.reason)
    assert resp.released


def test_a_refused_watch_raises_with_the_http_status() -> None:
    resp = Response([], status=403)
    with pytest.raises(ApiException) as err:
        list(events(lister(resp, {}), resource_version="1", timeout_s=5))
    assert err.value.status == 403
    assert resp.released


# --- the socket path: a watch is chunked over a real (loopback) connection ----------

@pytest.mark.parametrize(("pieces", "body", "done"), [
    ([b"5\r\nhello\r\n0\r\n\r\n"], b"hello", True),
    ([b"5\r\nhel", b"lo\r\n3;ext=1\r\nabc\r", b"\n"], b"helloabc", False),
    ([b"A\r\n0123456789\r\n", b"0\r\n", b"\r\n"], b"0123456789", True),
], ids=["whole", "split-mid-chunk-and-mid-crlf-with-an-extension", "last-chunk-apart"])
def test_chunked_framing_is_undone_however_the_bytes_are_cut(
        pieces: list[bytes], body: bytes, done: bool) -> None:
    d = kubewatch.Dechunker()
    assert b"".join(d.feed(p) for p in pieces) == body
    assert d.done is done


def test_a_chunk_not_ending_in_crlf_is_refused() -> None:
    with pytest.raises(ValueError, match="CRLF"):
        kubewatch.Dechunker().feed(b"3\r\nabcXY")


class WatchServer:
    """An HTTP/1.1 server on loopback writing watch events as the apiserver does: a
    chunk per event, flushed, with `gap_s` between them."""

    def __init__(self, lines: list[bytes], gap_s: float) -> None:
        self.lines, self.gap_s = lines, gap_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.recv(65536)  # the request
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for line in self.lines:
                conn.sendall(b"%x\r\n%s\r\n" % (len(line), line))
                time.sleep(self.gap_s)
            conn.sendall(b"0\r\n\r\n")
            time.sleep(0.2)

    def close(self) -> None:
        self.thread.join(5)
        self.sock.close()


# The lingering case waits 1 s, more than twice the 0.4 s the server takes to send
# everything, so a loaded machine's late sleeps still fit in a few reads.
@pytest.mark.parametrize(("linger_s", "most_reads"), [(0.0, 40), (1.0, 5)],
                         ids=["read-as-they-come", "a-busy-watch-is-read-in-bursts"])
def test_a_real_chunked_watch_comes_out_whole_in_order_and_lingering_reads_fewer_times(
        linger_s: float, most_reads: int) -> None:
    lines = [line("ADDED", f"o{i}", str(i)).rstrip(b"\n") + b"\n" for i in range(40)]
    server = WatchServer(lines, gap_s=0.01)
    pool = urllib3.PoolManager()
    try:
        def call(**kw: Any) -> Any:
            return pool.request("GET", f"http://127.0.0.1:{server.port}/w",
                                preload_content=False)
        got = list(kubewatch.bursts(call, resource_version="0", timeout_s=5,
                                    linger_s=linger_s))
    finally:
        server.close()
    names = [e["object"]["metadata"]["name"] for burst in got for e in burst]
    assert names == [f"o{i}" for i in range(40)]
    assert len(got) <= most_reads
    if linger_s:
        assert max(len(b) for b in got) >= 5  # events gathered while it lingered


def test_a_watch_on_a_descriptor_above_1024_is_read_too() -> None:
    """select() refuses descriptors >= 1024 (a busy service has that many open);
    the reader polls."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"open files are capped at {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    server = WatchServer([line("ADDED", f"o{i}", str(i)) for i in range(10)], gap_s=0.01)
    pool = urllib3.PoolManager()
    try:
        resp = pool.request("GET", f"http://127.0.0.1:{server.port}/w", preload_content=False)
        assert cast(Any, resp)._fp.fp.raw._sock.fileno() >= 1024
        got = list(events(lambda **kw: resp, resource_version="0", timeout_s=5,
                                    linger_s=0.05))
    finally:
        for fd in filler:
            os.close(fd)
        server.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [e["object"]["metadata"]["name"] for e in got] == [f"o{i}" for i in range(10)]


# --- managedFields left undecoded ----------------------------------------------------

MANAGED = [
    {"manager": "kueue-admission", "operation": "Apply", "apiVersion": "kueue.x-k8s.io/v1beta2",
     "time": "2026-12-03T11:59:19Z", "fieldsType": "FieldsV1", "subresource": "status",
     "fieldsV1": {"f:status": {"f:conditions": {'k:{"type":"QuotaReserved"}': {
         ".": {}, "f:lastTransitionTime": {}, "f:message": {}}}}}},
    {"manager": "kueue", "operation": "Update", "apiVersion": "kueue.x-k8s.io/v1beta2",
     "time": "2026-12-03T11:59:19Z", "fieldsType": "FieldsV1",
     "fieldsV1": {"f:metadata": {"f:ownerReferences": {'k:{"uid":"u-1"}': {}}}}},
]


def compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def workload_line(name: str, managed: list[Any]) -> bytes:
    """A custom resource as the apiserver writes it: keys in sorted order, so managedFields
    comes before name."""
    meta = {"creationTimestamp": "2026-12-03T11:59:18Z", "generation": 1,
            "labels": {"kueue.x-k8s.io/job-uid": "u-1"}, "managedFields": managed,
            "name": name, "namespace": "kestrel-acme", "resourceVersion": "42"}
    return compact({"type": "MODIFIED", "object": {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
        "spec": {"podSets": [{"count": 1, "name": "main"}]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}}})


def job_line(name: str, managed: list[Any]) -> bytes:
    """A built-in kind as the apiserver writes it: managedFields last in metadata."""
    meta = {"name": name, "namespace": "kestrel-acme", "labels": {"a": "b"},
            "managedFields": managed}
    return compact({"type": "ADDED", "object": {"kind": "Job", "apiVersion": "batch/v1",
                                                "metadata": meta, "spec": {"parallelism": 1}}})


def emptied(line: bytes) -> Any:
    """The line decoded the slow way, with managedFields emptied."""
    event = json.loads(line)
    for obj in [event["object"], *event["object"].get("items", [])]:
        if "managedFields" in obj.get("metadata", {}):
            obj["metadata"]["managedFields"] = []
    return event


@pytest.mark.parametrize("line", [
    workload_line("w1", MANAGED), job_line("j1", MANAGED), workload_line("w0", []),
    job_line("j0", []), compact({"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": "7"}}}),
], ids=["custom-resource", "built-in-kind", "empty-custom", "empty-built-in", "bookmark"])
def test_an_event_decodes_as_it_was_sent_with_its_managed_fields_left_out(line: bytes) -> None:
    assert kubewatch.loads(line) == emptied(line)
    assert kubewatch.event_of(line) == emptied(line)


def test_every_object_of_a_list_has_its_managed_fields_left_out() -> None:
    items = [json.loads(workload_line(f"w{i}", MANAGED))["object"] for i in range(3)]
    listed = compact({"kind": "WorkloadList", "metadata": {"resourceVersion": "9"},
                      "items": items})
    got = kubewatch.loads(listed)
    assert [o["metadata"]["managedFields"] for o in got["items"]] == [[], [], []]
    assert [o["metadata"]["name"] for o in got["items"]] == ["w0", "w1", "w2"]
    assert len(kubewatch.without_managed_fields(listed)) < len(listed) / 2


@pytest.mark.parametrize("manager", [
    'x}],"name":"evil',   # the end the cut looks for, inside a string
    "x}]}",               # a `}]` then the end of metadata, inside a string
    "x]",                 # a bracket inside a string
], ids=["a-fake-name-key", "a-fake-end-of-metadata", "a-bracket"])
def test_a_managed_field_that_looks_like_the_end_of_the_list_decodes_whole_or_right(
        manager: str) -> None:
    """A manager name with brackets (not one Kubernetes writes) never yields a wrong
    object: the cut is refused, or the cut text fails to decode and the whole is
    decoded, or the cut is right."""
    managed = [{**MANAGED[0], "manager": manager}, MANAGED[1]]
    for line in (workload_line("w1", managed), job_line("j1", managed)):
        got = kubewatch.loads(line)
        assert got in (json.loads(line), emptied(line))
        assert got["object"]["metadata"]["name"] in ("w1", "j1")
