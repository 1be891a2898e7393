"""Command-line options of the `gn` group, each also an ini key, and their validated values."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

# (option, ini key, help, kind)
_SPECS = (
    ("--gn-arch-sweep", "gn_arch_sweep", "run the bundled GroupNorm validation suite for every GPU profile "
     "(compile per arch, residency, overflow cases; PTX builds of older archs on this GPU)", "bool"),
    ("--gn-profiles", "gn_profiles", "comma-separated GPU profiles for the sweep (default: all built-in "
     "and user profiles)", "string"),
    ("--gn-max-resident", "gn_max_resident", "cap every one-pass GroupNorm launch at K co-resident blocks "
     "(sets GN_MAX_RESIDENT_BLOCKS)", "string"),
    ("--gn-impl", "gn_impl", "GroupNorm under test as module:callable taking (x, num_groups, weight, bias, "
     "eps, act) (default: gn_module.group_norm)", "string"),
    ("--gn-seed", "gn_seed", "base seed of generated inputs (default 0)", "string"),
)  # fmt: skip

DEFAULT_IMPL = "gn_module.functional:group_norm"


@dataclass(frozen=True)
class GnOptions:
    arch_sweep: bool = False
    profiles: str = ""
    max_resident: int | None = None
    impl: str = DEFAULT_IMPL
    seed: int = 0
    profiles_file: str = ""

    @property
    def foreign(self) -> bool:
        """True when the implementation under test is not gn_module's own."""
        return self.impl not in (DEFAULT_IMPL, "gn_module:group_norm")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("gn", "GroupNorm validation (pytest-gn)")
    for opt, ini, help_text, kind in _SPECS:
        if kind == "bool":
            group.addoption(opt, action="store_true", default=None, dest=ini, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            metavar = {"gn_profiles": "NAME,...", "gn_max_resident": "K", "gn_impl": "MODULE:CALLABLE",
                       "gn_seed": "N"}[ini]  # fmt: skip
            group.addoption(opt, action="store", default=None, dest=ini, metavar=metavar, help=help_text)
            parser.addini(ini, help_text, type="string", default="")
    parser.addini("gn_profiles_file", "TOML or JSON file with extra GPU profiles for the sweep", default="")


def _raw(config: pytest.Config, key: str):
    value = config.getoption(key, default=None)
    return config.getini(key) if value is None else value


def _int(text: str | int, what: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise pytest.UsageError(f"{what} expects an integer, got {text!r}") from None
    if value < minimum:
        raise pytest.UsageError(f"{what} must be >= {minimum}, got {value}")
    return value


def read_options(config: pytest.Config) -> GnOptions:
    """Options from the command line, falling back to ini keys; bad values raise UsageError."""
    impl = str(_raw(config, "gn_impl") or "").strip() or DEFAULT_IMPL
    if not re.fullmatch(r"[\w.]+:[\w.]+", impl):
        msg = f"--gn-impl expects module:callable (e.g. mypkg.norm:group_norm), got {impl!r}"
        raise pytest.UsageError(msg)
    cap = str(_raw(config, "gn_max_resident") or "").strip()
    seed = str(_raw(config, "gn_seed") or "").strip()
    return GnOptions(
        arch_sweep=bool(_raw(config, "gn_arch_sweep")),
        profiles=str(_raw(config, "gn_profiles") or "").strip(),
        max_resident=_int(cap, "--gn-max-resident", 1) if cap else None,
        impl=impl,
        seed=_int(seed, "--gn-seed", 0) if seed else 0,
        profiles_file=str(config.getini("gn_profiles_file") or "").strip(),
    )
