"""No spawn in the project asks subprocess for a fork() where it would vfork().

`preexec_fn`, `user`, `group` and `extra_groups` make subprocess fork() the caller, and a
fork() of a process with gRPC in use runs gRPC's child fork handlers, which crash the
child (grpcio 1.85: 49 of 200 such spawns died with SIGSEGV beside busy calls). What
those would do goes into the argv instead: kestrel_tools.procs.as_user,
kestrel.service.die_with_parent."""

from __future__ import annotations

import ast

import pytest

from kestrel_tools.procs import REPO

FORKING = frozenset({"preexec_fn", "user", "group", "extra_groups"})
SPAWNS = frozenset({"Popen", "run", "call", "check_call", "check_output",
                    "create_subprocess_exec", "create_subprocess_shell"})


def forking_spawns(source: str, name: str = "<source>") -> list[str]:
    """`file:line call(keyword=)` for each spawn in `source` that passes a forking
    keyword."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in SPAWNS:
            continue
        out += [f"{name}:{node.lineno} {called}({kw.arg}=)" for kw in node.keywords
                if kw.arg in FORKING]
    return out


@pytest.mark.parametrize(("source", "found"), [
    pytest.param("subprocess.Popen(cmd, user='postgres')", ["<source>:1 Popen(user=)"],
                 id="Popen as another user forks"),
    pytest.param("import subprocess as sp\nsp.run(cmd, preexec_fn=f)",
                 ["<source>:2 run(preexec_fn=)"], id="a preexec_fn forks, however imported"),
    pytest.param("asyncio.create_subprocess_exec(*cmd, group=0, extra_groups=[])",
                 ["<source>:1 create_subprocess_exec(group=)",
                  "<source>:1 create_subprocess_exec(extra_groups=)"],
                 id="asyncio's spawns take the same keywords"),
    pytest.param("subprocess.Popen([*as_user(uid, gid), cmd], start_new_session=True)", [],
                 id="an argv prefix and a new session do not fork"),
    pytest.param("record(user='x')", [], id="other calls with a user keyword are fine"),
])
def test_forking_spawns_are_found(source: str, found: list[str]) -> None:
    assert forking_spawns(source) == found


def test_no_spawn_in_the_project_forks() -> None:
    found = []
    for top in ("kestrel", "services", "bench", "tests"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            found += forking_spawns(path.read_text(), rel)
    assert found == [], ("use kestrel_tools.procs.as_user / kestrel.service.die_with_parent "
                         "instead: " + "; ".join(found))
