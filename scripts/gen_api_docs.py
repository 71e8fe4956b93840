"""docs/api.md from the comments in proto/kestrel/v1: every service and its methods,
every message with its fields, every enum with its values, as the .proto files say.

    .venv/bin/python scripts/gen_api_docs.py [OUT]    (make api-docs; make proto-check
                                                       fails when docs/api.md is stale)

protoc (grpcio-tools, already the stubs' generator) compiles the files with their
source info; the comments come from there, so the page says what the contracts say.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[1]
PROTO = REPO / "proto"
FieldD = descriptor_pb2.FieldDescriptorProto
LABEL = {FieldD.LABEL_REPEATED: "repeated "}
SCALAR = {v: k.removeprefix("TYPE_").lower() for k, v in FieldD.Type.items()}


def descriptors() -> descriptor_pb2.FileDescriptorSet:
    files = sorted(str(p.relative_to(PROTO)) for p in (PROTO / "kestrel" / "v1").glob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO}",
                        "--include_source_info", f"--descriptor_set_out={out}", *files],
                       check=True, cwd=PROTO)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def comments(f: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    out = {}
    for loc in f.source_code_info.location:
        text = (loc.leading_comments or loc.trailing_comments).strip()
        if text:
            out[tuple(loc.path)] = " ".join(line.strip() for line in text.splitlines())
    return out


def type_name(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type_name:
        name = field.type_name.lstrip(".").removeprefix("kestrel.v1.")
        anchor = name.lower().replace(".", "")
        return f"[`{name}`](#{anchor})" if not name.startswith("google.") else f"`{name}`"
    return f"`{SCALAR[field.type]}`"


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(fds: descriptor_pb2.FileDescriptorSet) -> str:
    lines = ["# API reference", "",
             "Generated from the comments in `proto/kestrel/v1` by `make api-docs`; do not "
             "edit (`make test` fails when it is stale). Every service serves gRPC server "
             "reflection, so `grpcurl -plaintext ADDR describe SYMBOL` answers the same.", ""]
    for f in fds.file:
        c = comments(f)
        lines += [f"## {f.name.removeprefix('kestrel/v1/')}", ""]
        for si, s in enumerate(f.service):
            lines += [f"### {s.name}", "", c.get((6, si), ""), "",
                      "| method | request | response | what it does |", "|---|---|---|---|"]
            for mi, m in enumerate(s.method):
                req = ("stream " if m.client_streaming else "") + m.input_type.split(".")[-1]
                resp = ("stream " if m.server_streaming else "") + m.output_type.split(".")[-1]
                lines.append(f"| `{m.name}` | `{req}` | `{resp}` | "
                             f"{cell(c.get((6, si, 2, mi), ''))} |")
            lines.append("")

        def message(m: descriptor_pb2.DescriptorProto, path: tuple[int, ...],
                    prefix: str) -> None:
            name = prefix + m.name
            lines.extend([f"### {name}", "", c.get(path, ""), ""])
            maps = {f".{f.package}.{name}.{n.name}": n for n in m.nested_type
                    if n.options.map_entry}
            if m.field:
                lines.extend(["| field | type | what it is |", "|---|---|---|"])
                for fi, field in enumerate(m.field):
                    entry = maps.get(field.type_name)
                    shown = (f"map<{type_name(entry.field[0])}, {type_name(entry.field[1])}>"
                             if entry is not None
                             else LABEL.get(field.label, "") + type_name(field))
                    lines.append(f"| `{field.name}` = {field.number} | {shown} | "
                                 f"{cell(c.get((*path, 2, fi), ''))} |")
                lines.append("")
            for ei, e in enumerate(m.enum_type):
                enum(e, (*path, 4, ei), name + ".")
            for ni, nested in enumerate(m.nested_type):
                if not nested.options.map_entry:
                    message(nested, (*path, 3, ni), name + ".")

        def enum(e: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...],
                 prefix: str) -> None:
            lines.extend([f"### {prefix}{e.name}", "", c.get(path, ""), "",
                          "| value | number | what it means |", "|---|---|---|"])
            for vi, v in enumerate(e.value):
                lines.append(f"| `{v.name}` | {v.number} | {cell(c.get((*path, 2, vi), ''))} |")
            lines.append("")

        for mi, m in enumerate(f.message_type):
            message(m, (4, mi), "")
        for ei, e in enumerate(f.enum_type):
            enum(e, (5, ei), "")
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip() + "\n"


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "api.md"
    out.write_text(render(descriptors()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
