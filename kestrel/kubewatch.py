"""One Kubernetes watch, read as the apiserver writes it: a line of JSON per event.

The client's `Watch.stream` decodes each line with the standard library's json, and
with `deserialize=False` turns an ERROR event (410 Gone above all) into
KeyError('raw_object') instead of the status it carries. Watch events are most of what
the placer and the runway check decode (a fifth of the placer's CPU in bench-jobs was
json's decoder), so this reads the stream itself: orjson per line, and an ERROR event
raised as the ApiException it describes, so a 410 relists like a 410 from a list.

Reads are grouped by wake-up (`bursts`). The apiserver writes each event as an HTTP
chunk of its own, in a TLS record of its own, so urllib3's chunk-by-chunk stream woke
the reading thread once per event, and on these machines a wake-up of a thread blocked
on a socket cost about 140 us of CPU, against 20 us to decode a Workload. When a watch
is busy (the last read was under `linger_s` ago), the reader waits `linger_s` after a
first byte arrives and then takes everything the socket holds at once, de-chunking it
itself: one wake-up per `linger_s` however many events came, each event at most
`linger_s` late. An idle watch is read as before, one event as it comes.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

__all__ = ["Dechunker", "bursts", "changes", "loads", "without_managed_fields"]

MANAGED_FIELDS = b'"managedFields":['


def without_managed_fields(data: bytes) -> bytes:
    """The JSON text with every `metadata.managedFields` list emptied, before decoding.

    The apiserver sends each object's field ownership (server-side apply's record) with
    it: over half of a Kestrel Workload's bytes (3.4 of 6.2 KB: a tree of small objects
    per manager, five managers), 40 % of a Job's and a Pod's. Nothing here reads it, and
    decoding it into dicts and freeing them again was most of decoding a Workload. Every
    object read here is only ever patched, never written back whole, so the emptied
    list never reaches the apiserver (an update with an empty list would clear it).

    The cut relies on what the schema allows: managedFields entries hold strings and one
    fieldsV1 object, a tree of objects whose keys name fields, so the list's first `]`
    ends it. Each cut is checked against how the apiserver writes it: a `}` (or the
    `[`) before that `]`, and after it the end of metadata (built-in kinds: the last
    field of ObjectMeta) or `"name"` (custom resources: keys in sorted order), with as
    many `{` as `}` inside. One that fails leaves the text whole, and `loads` decodes the
    original when the cut text is not valid JSON."""
    at = data.find(MANAGED_FIELDS)
    if at < 0:
        return data
    parts: list[bytes] = []
    done = 0
    while at >= 0:
        start = at + len(MANAGED_FIELDS)
        end = data.find(b"]", start)
        if end < 0 or data[end - 1:end] not in (b"}", b"[") or not (
                data.startswith(b"}", end + 1) or data.startswith(b',"name":', end + 1)):
            return data
        if data.count(b"{", start, end) != data.count(b"}", start, end):
            return data
        parts.append(data[done:start])
        done = end
        at = data.find(MANAGED_FIELDS, end)
    parts.append(data[done:])
    return b"".join(parts)


def loads(data: bytes) -> Any:
    """A Kubernetes JSON response or watch line, decoded without managedFields."""
    try:
        return orjson.loads(without_managed_fields(data))
    except orjson.JSONDecodeError:
        return orjson.loads(data)  # the cut went wrong: decode it whole (or raise)

READ_SIZE = 1 << 16
FIRST_READ = 1 << 20  # more than http.client's reader buffers (8 KiB): all of it comes out
BURST_MAX = 1 << 22  # bytes taken in one wake-up at most: a flood still yields as it reads


def bursts(call: Callable[..., Any], *args: Any, resource_version: str, timeout_s: int,
           linger_s: float = 0.0, **kwargs: Any) -> Iterator[list[dict[str, Any]]]:
    """Watch events of `call` (a list call of the Kubernetes client, or one taking the
    same keywords) from `resource_version` until the apiserver ends the watch after
    `timeout_s`, in lists of the events one read brought: each a dict with "type" and
    "object", bookmarks included. An ERROR event raises ApiException with its code and
    message, after the events before it."""
    resp = call(*args, watch=True, resource_version=resource_version,
                timeout_seconds=timeout_s, allow_watch_bookmarks=True,
                _preload_content=False, **kwargs)
    try:
        status = getattr(resp, "status", 200)
        if not 200 <= status <= 299:
            raise ApiException(status=status, reason=resp.reason,
                               http_resp=None) from None
        rest = b""
        for data in _body(resp, linger_s):
            lines = (rest + data).split(b"\n")
            rest = lines.pop()
            yield from _decoded(lines)
        if rest.strip():
            yield from _decoded([rest])
    finally:
        # Closed before it goes back to the pool, as the client's own Watch does: a
        # watch left mid-stream (an ERROR event, a stop) still has bytes unread, and a
        # pooled connection with a body pending would hand them to the next request.
        resp.close()
        resp.release_conn()


def changes(burst: list[dict[str, Any]],
            resource_version: str) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """What a burst changed, as (ADDED|MODIFIED|DELETED, object) in order, bookmarks left
    out, and the resourceVersion to watch on from (bookmarks included)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for event in burst:
        obj = event.get("object") or {}
        resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
            out.append((str(event["type"]), obj))
    return out, resource_version


def _decoded(lines: list[bytes]) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            batch.append(event_of(line))
        except ApiException:
            if batch:
                yield batch
            raise
    if batch:
        yield batch


def event_of(line: bytes) -> dict[str, Any]:
    """One line of a watch as its event; an ERROR event raises its status."""
    event: dict[str, Any] = loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        raise ApiException(status=int(status.get("code") or 500),
                           reason=str(status.get("message") or status.get("reason") or ""))
    return event


def _body(resp: Any, linger_s: float) -> Iterator[bytes]:
    """The response body (chunk framing removed) as it arrives: straight from the socket
    when the response is chunked over one (the apiserver's watch always is), else
    through urllib3's own stream."""
    fp = getattr(getattr(resp, "_fp", None), "fp", None)  # http.client's buffered reader
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    chunked = str((getattr(resp, "headers", None) or {}).get("Transfer-Encoding", "")).lower()
    if fp is None or sock is None or chunked != "chunked":
        yield from resp.stream(amt=None, decode_content=False)
        return
    dechunk = Dechunker()
    for data in _socket_reads(fp, sock, linger_s):
        body = dechunk.feed(data)
        if body:
            yield body
        if dechunk.done:
            return


def _socket_reads(fp: Any, sock: Any, linger_s: float) -> Iterator[bytes]:
    """Bytes as the socket has them, each wake-up's worth at once. `fp` (the client's
    buffered reader) is drained first: the headers' read may have buffered a first event."""
    first = fp.read1(FIRST_READ)  # what its buffer holds, or one read of the socket
    if not first:
        return
    yield first
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    pending: Callable[[], int] = getattr(sock, "pending", lambda: 0)  # TLS: decrypted, unread
    # poll, not select: select refuses a descriptor numbered 1024 or more.
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    last = time.monotonic()
    while True:
        n = sock.recv_into(buf)
        if n == 0:
            return
        parts, size = [bytes(view[:n])], n
        now = time.monotonic()
        if linger_s > 0 and now - last < linger_s:
            time.sleep(linger_s)  # busy: let the rest of the burst arrive
        while size < BURST_MAX and (pending() or poller.poll(0)):
            n = sock.recv_into(buf)
            if n == 0:
                yield b"".join(parts)
                return
            parts.append(bytes(view[:n]))
            size += n
        last = time.monotonic()
        yield b"".join(parts)


class Dechunker:
    """HTTP/1.1 chunked transfer coding, undone incrementally: `feed` takes bytes as
    they arrive and returns the body bytes of every chunk now complete; `done` once the
    last (zero-size) chunk came."""

    def __init__(self) -> None:
        self.buf = b""
        self.done = False

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        at = 0
        while True:
            eol = buf.find(b"\r\n", at)
            if eol < 0:
                break
            head = buf[at:eol].split(b";", 1)[0].strip()
            try:
                size = int(head, 16)
            except ValueError:
                raise ValueError(f"malformed chunk size {head[:20]!r} in a watch") from None
            if size == 0:
                self.done = True
                at = len(buf)  # trailers, if any, are not read
                break
            start = eol + 2
            end = start + size
            if len(buf) < end + 2:
                break  # the rest of this chunk is still on its way
            if buf[end:end + 2] != b"\r\n":
                raise ValueError("a watch chunk does not end with CRLF")
            out.append(buf[start:end])
            at = end + 2
        self.buf = buf[at:]
        return b"".join(out)
