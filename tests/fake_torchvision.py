"""A stand-in for torchvision, so that timm imports where torchvision is not installed (CPU tests).

timm imports a few torchvision names at import time (``FrozenBatchNorm2d``, transforms) that the
models the tests build never use. `install()` puts a meta-path finder first on ``sys.meta_path``
that answers every ``torchvision`` / ``torchvision.*`` import with an empty package whose missing
attributes are new `nn.Module` subclasses of that name. Use it in a subprocess (or `uninstall()`
right after importing timm): other tests must still see torchvision missing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

from torch import nn

PACKAGE = "torchvision"


class _FakeClass(type):
    """Metaclass of the stand-in classes: a missing class attribute (``InterpolationMode.NEAREST``) is a
    string naming it (distinct and hashable: timm uses some as dict keys)."""

    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__module__}.{cls.__qualname__}.{name}"


class _FakeModule(types.ModuleType):
    """A package whose every missing public attribute is an nn.Module subclass of that name."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _FakeClass(name, (nn.Module,), {"__module__": self.__name__})
        setattr(self, name, cls)
        return cls


class FakeTorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == PACKAGE or fullname.startswith(PACKAGE + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _FakeModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # a package: submodule imports come back to this finder


def install() -> FakeTorchvisionFinder:
    finder = FakeTorchvisionFinder()
    sys.meta_path.insert(0, finder)
    return finder


def uninstall(finder: FakeTorchvisionFinder) -> None:
    """Remove the finder and every fake module it made (modules that imported names keep them)."""
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name in [n for n, m in sys.modules.items() if isinstance(m, _FakeModule)]:
        del sys.modules[name]
