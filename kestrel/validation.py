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


def _walk(msg: Message, prefix: str, out: list[FieldViolation]) -> None:
    for fd, value in msg.ListFields():
        if len(out) >= _MAX_VIOLATIONS:
            return
        path = f"{prefix}{fd.name}"
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            key_fd = entry.fields_by_name["key"]
            value_fd = entry.fields_by_name["value"]
            for key in sorted(value):
                item_path = f"{path}[{_key_text(key)}]"
                if key_fd.type == FieldDescriptor.TYPE_STRING:
                    _check(fd, key, item_path, out, what="key ")
                item = value[key]
                if value_fd.type == FieldDescriptor.TYPE_STRING:
                    _check(fd, item, item_path, out)
                elif value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _walk(item, f"{item_path}.", out)
        elif fd.is_repeated:
            for i, item in enumerate(value):
                if fd.type == FieldDescriptor.TYPE_STRING:
                    _check(fd, item, f"{path}[{i}]", out)
                elif fd.type == FieldDescriptor.TYPE_MESSAGE:
                    _walk(item, f"{path}[{i}].", out)
        elif fd.type == FieldDescriptor.TYPE_STRING:
            _check(fd, value, path, out)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            _walk(value, f"{path}.", out)


def _check(fd: FieldDescriptor, value: str, path: str, out: list[FieldViolation],
           what: str = "") -> None:
    problem = string_problem(value, MAX_CHARS.get(fd.full_name, DEFAULT_MAX_CHARS))
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
