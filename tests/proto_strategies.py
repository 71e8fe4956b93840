"""Hypothesis strategies built from protobuf descriptors alone (issue 17).

`requests(desc, vocabulary)` draws the wire bytes of a request for any message
descriptor, so a new RPC or a new field is fuzzed without editing a test:

- a message built field by field: boundary integers of each type, NaN and the
  infinities, empty, huge, NUL- and control-laden strings, unknown enum values,
  long repeated fields and maps, nested messages (depth-bounded), and, often,
  words from `vocabulary` (real tenants, job ids, flavors) so a call gets past
  the cheap checks into the RPC body;
- raw bytes a protobuf library would never write: invalid UTF-8 in a string
  field at any depth, a known field with the wrong wire type, a truncated
  body, plain garbage;
- an oversized message (over grpc's 4 MiB receive limit).

A draw is `Case(kind, data)`: the bytes go on the wire as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

F = FieldDescriptor
INT_BOUNDS: dict[int, tuple[int, int]] = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1), F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1),
}
MAX_DEPTH = 4
GRPC_MAX_RECEIVE = 4 * 1024 * 1024


@dataclass(frozen=True)
class Case:
    kind: str  # "message", "invalid-utf8", "wrong-wire-type", "truncated", "garbage", "oversized"
    data: bytes

    def __repr__(self) -> str:  # what a failure report shows: short and exact
        shown = self.data if len(self.data) <= 300 else self.data[:300] + b"..."
        return f"Case({self.kind!r}, {shown!r} ({len(self.data)} bytes))"


def _sub(fd: FieldDescriptor) -> Descriptor:
    assert fd.message_type is not None
    return fd.message_type


def new_message(desc: Descriptor) -> Message:
    msg: Message = message_factory.GetMessageClass(desc)()
    return msg


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """The type's bounds, their neighbours and the values limits are made of, or any."""
    edges = sorted({v for v in (lo, hi, lo + 1, hi - 1, 0, 1, -1, 8, 9, 60, 1000, 1001,
                                100_001, 7 * 86_400 + 1, 2**31 - 1, -(2**31), 2**32, 2**53,
                                1_700_000_000_000_000) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def strings(vocabulary: Sequence[str], huge_ok: bool = True) -> st.SearchStrategy[str]:
    nasty = st.sampled_from([
        "", " ", "\x00", "a\x00b", "\t\n", "\x1b[31m", "\x7f", "\u0085", "\u200b", "\ufeff",
        "\ud7ff", "ｔｅｎａｎｔ", "../../etc/passwd", "' OR 1=1 --", "%s%n", "${jndi:x}", "*",
        ">", "kestrel.>", "a.b", "job-", "job-0123456789abcdeg", "-1", "1e309", "NaN",
        "0.0000000001", "99999999999999999999999999", "-5", "1,5",
    ])
    huge = st.sampled_from([4096, 4097, 65_536, 1_000_000]).flatmap(
        lambda n: st.sampled_from(["a" * n, "\x00" * n, "é" * n]))
    words = st.sampled_from(list(vocabulary)) if vocabulary else st.just("x")
    mutated = words.flatmap(lambda w: st.sampled_from(
        [w.upper(), w + "\x00", w + " ", w + "\n", w[:-1], w + "0", " " + w, w * 2]))
    if not huge_ok:
        return st.one_of(words, words, mutated, nasty, st.text(max_size=40))
    return st.one_of(words, words, mutated, nasty, st.text(max_size=40), huge)


def _scalar(fd: FieldDescriptor, vocabulary: Sequence[str],
            huge_ok: bool = True) -> st.SearchStrategy[object]:
    t = fd.type
    if t in INT_BOUNDS:
        return integers(*INT_BOUNDS[t])
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        single = t == F.TYPE_FLOAT
        return st.one_of(st.sampled_from([0.0, -0.0, 1.5, -1.0, 3e38 if single else 1e300,
                                          1e-38 if single else 1e-300, 1e-45 if single
                                          else 5e-324, float("inf"), float("-inf"),
                                          float("nan")]),
                         st.floats(width=32) if single else st.floats())
    if t == F.TYPE_STRING:
        return strings(vocabulary, huge_ok)
    if t == F.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * (70_000 if huge_ok else 70)))
    if t == F.TYPE_ENUM:
        assert fd.enum_type is not None
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known),
                         st.sampled_from([max(known) + 1, 99, -1, 2**31 - 1, -(2**31)]))
    raise AssertionError(f"no strategy for {fd.full_name} (type {t})")


def _lists(inner: st.SearchStrategy[object],
           small: st.SearchStrategy[object]) -> st.SearchStrategy[list[object]]:
    """Mostly short lists; sometimes one small value repeated thousands of times."""
    return st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4),
                     st.tuples(small, st.sampled_from([65, 1000, 20_000]))
                     .map(lambda p: [p[0]] * p[1]))


@st.composite
def messages(draw: st.DrawFn, desc: Descriptor, vocabulary: Sequence[str],
             depth: int = 0, huge_ok: bool = True) -> Message:
    """A message of `desc`, each field set or not, with hostile values. Huge strings
    only near the top and never in a long list, so a draw stays well under 2 GiB."""
    msg = new_message(desc)
    huge_ok = huge_ok and depth <= 1
    for fd in desc.fields:
        if depth >= MAX_DEPTH and fd.type == F.TYPE_MESSAGE:
            continue
        if not draw(st.booleans()):
            continue
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_fd, value_fd = entry.fields_by_name["key"], entry.fields_by_name["value"]
            key_s = _scalar(key_fd, vocabulary, huge_ok)
            value_s: st.SearchStrategy[object] = (
                messages(_sub(value_fd), vocabulary, depth + 1, huge_ok=False)
                if value_fd.type == F.TYPE_MESSAGE else _scalar(value_fd, vocabulary, huge_ok))
            many = draw(st.sampled_from([0, 0, 0, 40, 5000]))
            items = draw(st.dictionaries(key_s, value_s, max_size=4))
            if many:  # a map far larger than any limit, of one small value
                filler = draw(messages(_sub(value_fd), vocabulary, MAX_DEPTH - 1, huge_ok=False)
                              if value_fd.type == F.TYPE_MESSAGE
                              else _scalar(value_fd, vocabulary, huge_ok=False))
                items.update({f"k{i}" if key_fd.type == F.TYPE_STRING else i: filler
                              for i in range(many)})
            target = getattr(msg, fd.name)
            for k, val in items.items():
                if value_fd.type == F.TYPE_MESSAGE:
                    target[k].CopyFrom(val)
                else:
                    target[k] = val
        elif fd.is_repeated:
            inner: st.SearchStrategy[object] = (
                messages(_sub(fd), vocabulary, depth + 1, huge_ok)
                if fd.type == F.TYPE_MESSAGE else _scalar(fd, vocabulary, huge_ok))
            small: st.SearchStrategy[object] = (
                messages(_sub(fd), vocabulary, MAX_DEPTH - 1, huge_ok=False)
                if fd.type == F.TYPE_MESSAGE else _scalar(fd, vocabulary, huge_ok=False))
            values = draw(_lists(inner, small))
            getattr(msg, fd.name).extend(values)
        elif fd.type == F.TYPE_MESSAGE:
            getattr(msg, fd.name).CopyFrom(draw(messages(_sub(fd), vocabulary, depth + 1,
                                                         huge_ok)))
        else:
            setattr(msg, fd.name, draw(_scalar(fd, vocabulary, huge_ok)))
    return msg


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _delimited(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def string_paths(desc: Descriptor, depth: int = 0) -> list[list[FieldDescriptor]]:
    """Every chain of (singular or repeated) message fields ending in a string field."""
    out: list[list[FieldDescriptor]] = []
    for fd in desc.fields:
        if fd.type == F.TYPE_STRING:
            out.append([fd])
        elif fd.type == F.TYPE_MESSAGE and depth < MAX_DEPTH:
            # a map<string, ...> is a repeated entry message: its key or value
            out += [[fd, *p] for p in string_paths(_sub(fd), depth + 1)]
    return out


@st.composite
def raw_requests(draw: st.DrawFn, desc: Descriptor, vocabulary: Sequence[str]) -> Case:
    """Bytes that are not a valid encoding of `desc`."""
    base = draw(messages(desc, vocabulary)).SerializeToString()
    paths = string_paths(desc)
    kinds = ["wrong-wire-type", "truncated", "garbage"] + (["invalid-utf8"] * 3 if paths else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "invalid-utf8":
        path = draw(st.sampled_from(paths))
        payload = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"ok\xed\xa0\x80", b"\xf8\x88\x80",
                                        b"a" * 10 + b"\x80"]))
        for step in reversed(path):
            payload = _delimited(step.number, payload)
        return Case(kind, base + payload)
    if kind == "wrong-wire-type":
        fd: FieldDescriptor | None = (draw(st.sampled_from(list(desc.fields)))
                                      if desc.fields else None)
        number = fd.number if fd is not None else 1
        wire = 2 if fd is not None and fd.type not in (F.TYPE_STRING, F.TYPE_BYTES,
                                                       F.TYPE_MESSAGE) and not fd.is_repeated \
            else draw(st.sampled_from([0, 1, 5]))
        tail = {0: _varint(7), 1: b"\x00" * 8, 2: _varint(3) + b"abc", 5: b"\x00" * 4}[wire]
        return Case(kind, base + _varint((number << 3) | wire) + tail)
    if kind == "truncated":
        blob = base + _delimited(1, b"x" * 20)
        return Case(kind, blob[:-draw(st.integers(1, 10))])
    return Case(kind, draw(st.sampled_from([b"\xff\xff\xff\xff", b"\x0f", b"\x00",
                                            b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80"]))
                + draw(st.binary(max_size=32)))


def requests(desc: Descriptor, vocabulary: Sequence[str]) -> st.SearchStrategy[Case]:
    """Any request bytes for `desc`: hostile messages mostly, malformed bytes often,
    an oversized one now and then."""
    valid = messages(desc, vocabulary).map(lambda m: Case("message", m.SerializeToString()))
    oversized = st.just(Case("oversized", _delimited(
        desc.fields[0].number if desc.fields else 1, b"a" * (GRPC_MAX_RECEIVE + 16))))
    rare = st.integers(0, 19)
    return st.one_of(valid, valid, valid, raw_requests(desc, vocabulary),
                     rare.flatmap(lambda n: oversized if n == 0 else valid))
