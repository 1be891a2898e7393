"""scripts/*.py imported by the tests: they are scripts, not a package, so each is loaded from its file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str, *, register: bool = False) -> ModuleType:
    """scripts/<name>.py as a module; `register` puts it in sys.modules first (a module that defines
    dataclasses needs it there while they are built)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
