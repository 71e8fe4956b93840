"""kestrel_tools.cluster's lazy exports: each name is the object its submodule defines, also
after every submodule was imported (importing a submodule sets the package attribute of
its name, which shadowed a function of the same name: `kc.build` became a module)."""

from __future__ import annotations

import importlib
import pkgutil
import types

import kestrel_tools.cluster as kc


def test_every_exported_name_is_its_object_after_all_submodules_are_imported() -> None:
    for info in pkgutil.iter_modules(kc.__path__):
        importlib.import_module(f"kestrel_tools.cluster.{info.name}")
    for name in kc.__all__:
        value = getattr(kc, name)
        assert not isinstance(value, types.ModuleType), f"kc.{name} is a module"
    from kestrel_tools.cluster.build import build
    assert kc.build is build
