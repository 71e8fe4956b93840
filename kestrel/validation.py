"""Generic checks every request gets before a servicer sees it, pure: message in,
field violations out.

`check_strings` walks any protobuf message through its descriptor (nested messages,
repeated fields, maps, keys included) and flags every string that could not be
stored or shown as given:

- NUL and other control characters (C0, DEL, C1). Tab and newline are allowed
  everywhere: free-text notes and reasons may span lines, and identifiers are held
  to their own patterns by the servicers' per-field checks anyway.
- Longer than `DEFAULT_MAX_CHARS` characters (4096), or a per-field override in
  `MAX_CHARS` keyed by the field's full protobuf name.

The per-field checks of each servicer (names, amounts, ids) stay: they carry the
meaning; this layer guarantees nothing unstorable reaches a store, whatever the RPC.
Paths read like the servicers' own: `spec.command[3]`, `spec.labels[team]`.
"""

from __future__ import annotations

import re

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kestrel.errors import FieldViolation, InvalidArgument

DEFAULT_MAX_CHARS = 4096
# Full field name -> limit, for string fields that legitimately need more.
MAX_CHARS: dict[str, int] = {}
# C0 controls but tab and newline, DEL, and C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_MAX_VIOLATIONS = 20


def string_problem(value: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"must be at most {limit} characters (got {len(value)})"
    bad = _CONTROL.search(value)
    if bad is not None:
        what = "NUL" if bad.group() == "\x00" else f"U+{ord(bad.group()):04X}"
        return f"must not contain control characters ({what} at position {bad.start()})"
    return None


def _key_text(key: object) -> str:
    text = str(key)
    if isinstance(key, str) and string_problem(text, 64) is not None:
        return repr(text[:64])
    return text


# How _walk treats a field, worked out once per field descriptor: most fields of a
# message are scalars to skip, and reading a field's options, message type and full
# name on every call was most of the walk's cost (15 us per workload event, 13 % of the
# meter's samples in bench-meter).
_SKIP, _STRING, _MESSAGE, _STRINGS, _MESSAGES, _MAP = range(6)
_PLANS: dict[FieldDescriptor, tuple[int, int, bool, int]] = {}


def _plan(fd: FieldDescriptor) -> tuple[int, int, bool, int]:
    """(kind, string limit, a map's key is a string, a map value's kind)."""
    plan = _PLANS.get(fd)
    if plan is not None:
        return plan
    limit = MAX_CHARS.get(fd.full_name, DEFAULT_MAX_CHARS)
    entry = fd.message_type
    is_string, is_message = (fd.type == FieldDescriptor.TYPE_STRING,
                             fd.type == FieldDescriptor.TYPE_MESSAGE)
    if entry is not None and entry.GetOptions().map_entry:
        value_fd = entry.fields_by_name["value"]
        value_kind = (_STRING if value_fd.type == FieldDescriptor.TYPE_STRING else
                      _MESSAGE if value_fd.type == FieldDescriptor.TYPE_MESSAGE else _SKIP)
        key_is_string = entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        plan = (_MAP, limit, key_is_string, value_kind)
    elif fd.is_repeated:
        plan = (_STRINGS if is_string else _MESSAGES if is_message else _SKIP, limit, False,
                _SKIP)
    else:
        plan = (_STRING if is_string else _MESSAGE if is_message else _SKIP, limit, False,
                _SKIP)
    _PLANS[fd] = plan
    return plan


def _fine(value: str, limit: int) -> bool:
    return len(value) <= limit and _CONTROL.search(value) is None


def _walk(msg: Message, prefix: str, out: list[FieldViolation]) -> None:
    for fd, value in msg.ListFields():
        kind, limit, key_is_string, value_kind = _plan(fd)
        if kind == _SKIP:
            continue
        if len(out) >= _MAX_VIOLATIONS:
            return
        if kind == _STRING:
            if not _fine(value, limit):
                _check(value, limit, f"{prefix}{fd.name}", out)
        elif kind == _MESSAGE:
            _walk(value, f"{prefix}{fd.name}.", out)
        elif kind == _STRINGS:
            for i, item in enumerate(value):
                if not _fine(item, limit):
                    _check(item, limit, f"{prefix}{fd.name}[{i}]", out)
        elif kind == _MESSAGES:
            for i, item in enumerate(value):
                _walk(item, f"{prefix}{fd.name}[{i}].", out)
        else:  # a map, in key order
            for key in sorted(value):
                item_path = f"{prefix}{fd.name}[{_key_text(key)}]"
                if key_is_string and not _fine(key, limit):
                    _check(key, limit, item_path, out, what="key ")
                item = value[key]
                if value_kind == _STRING:
                    if not _fine(item, limit):
                        _check(item, limit, item_path, out)
                elif value_kind == _MESSAGE:
                    _walk(item, f"{item_path}.", out)


def _check(value: str, limit: int, path: str, out: list[FieldViolation],
           what: str = "") -> None:
    problem = string_problem(value, limit)
    if problem is not None:
        out.append(FieldViolation(path, f"{what}{problem}"))


def string_violations(msg: Message) -> list[FieldViolation]:
    """Every string in `msg`, at any depth, that is too long or holds control characters."""
    out: list[FieldViolation] = []
    _walk(msg, "", out)
    return out


def check_strings(msg: Message) -> None:
    """Raise InvalidArgument naming each offending string field of `msg`."""
    violations = string_violations(msg)
    if violations:
        raise InvalidArgument(violations)
