"""kestrel.kubewatch reading a watch stream: events split across chunks come out
whole, bookmarks pass, an ERROR event raises its status (410 Gone relists), a refused
watch raises, and the connection goes back to the pool closed however the read ends
(one left mid-stream would hand its unread bytes to the next request)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
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
    got = list(kubewatch.events(lister(resp, seen), "g", resource_version="0", timeout_s=5))
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in got] == [
        ("ADDED", "1"), ("MODIFIED", "2"), ("BOOKMARK", "3")]
    assert seen["watch"] is True and seen["resource_version"] == "0"
    assert seen["timeout_seconds"] == 5 and seen["allow_watch_bookmarks"] is True
    assert seen["_preload_content"] is False and seen["args"] == ("g",)
    assert resp.released


def test_a_last_line_without_newline_is_still_an_event() -> None:
    resp = Response([line("ADDED", "a", "1").rstrip(b"\n")])
    got = list(kubewatch.events(lister(resp, {}), resource_version="0", timeout_s=5))
    assert [e["object"]["metadata"]["name"] for e in got] == ["a"]


def test_an_error_event_raises_its_status_so_a_410_relists() -> None:
    gone = json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "code": 410, "reason": "Expired",
        "message": "too old resource version: 1 (42)"}}).encode() + b"\n"
    resp = Response([line("ADDED", "a", "1") + gone + line("ADDED", "b", "2")])
    it = kubewatch.events(lister(resp, {}), resource_version="1", timeout_s=5)
    assert next(it)["type"] == "ADDED"
    with pytest.raises(ApiException) as err:
        next(it)
    assert err.value.status == 410 and "too old" in str(err.value.reason)
    assert resp.released


def test_a_refused_watch_raises_with_the_http_status() -> None:
    resp = Response([], status=403)
    with pytest.raises(ApiException) as err:
        list(kubewatch.events(lister(resp, {}), resource_version="1", timeout_s=5))
    assert err.value.status == 403
    assert resp.released
