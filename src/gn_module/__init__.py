"""gn_module: overflow-safe, deterministic GroupNorm for channels-last CUDA tensors.

Submodules load lazily so that importing the package (as the pytest plugin does for the
schedule model) never imports torch or builds the CUDA extension.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "group_norm": "gn_module.functional",
    "GroupNorm": "gn_module.module",
    "GroupNormError": "gn_module.functional",
    "GroupNormTypeError": "gn_module.functional",
    "GroupNormDtypeError": "gn_module.functional",
    "max_resident_blocks": "gn_module.ops",
    "plan": "gn_module.ops",
    "build_variant": "gn_module.ops",
    "convert_groupnorm": "gn_module.convert",
    "revert_groupnorm": "gn_module.convert",
    "GNSwapCallback": "gn_module.callback",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gn_module' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
