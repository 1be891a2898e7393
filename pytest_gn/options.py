"""Command-line options of the `gn` group, each also an ini key, and their validated values."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

# (option, ini key, metavar (None: a flag), help); the help serves both the option and the ini key.
_SPECS = (
    ("--gn-arch-sweep", "gn_arch_sweep", None, "run the bundled GroupNorm validation suite for every GPU "
     "profile (compile per arch, residency, overflow cases; PTX builds of older archs on this GPU). "
     "Default: off"),
    ("--gn-profiles", "gn_profiles", "NAME,...", "comma-separated GPU profiles for the sweep. Default: all "
     "built-in and user profiles"),
    ("--gn-max-resident", "gn_max_resident", "K", "cap every one-pass GroupNorm launch at K co-resident "
     "blocks (sets GN_MAX_RESIDENT_BLOCKS). Default: no cap"),
    ("--gn-impl", "gn_impl", "MODULE:CALLABLE", "GroupNorm under test, a callable taking (x, num_groups, "
     "weight, bias, eps, act); on the command line without test paths it runs the bundled validation "
     "suite. Default: gn_module.group_norm"),
    ("--gn-shapes", "gn_shapes", "C:G,...", "(channels, groups) pairs of the overflow cases of every "
     "overflow_grid marker that names no shapes, e.g. 128:16,100:20. Default: "
     "128:16,100:20,30:10,64:1,32:32"),
    ("--gn-seed", "gn_seed", "N", "base seed of generated inputs. Default: 0"),
    ("--gn-arch", "gn_arch", "tiles|tasks|both", "kernel architecture(s) of gn_module the overflow "
     "cases validate: tiles (the tile kernels, forward and backward; gn_module's default backward), tasks "
     "(the task kernels: forward cases under GN_ARCH=tasks, gn_module's default forward, the ratio counting "
     "chunks per block over the chunks it keeps in shared memory; backward cases under GN_ARCH=tasks+bwd, "
     "the ratio counting a task's tiles over its team's members; one-launch backward cases under "
     "GN_ARCH=tasks+bwd1, the ratio counting chunk pairs per block over those it keeps; capped cases at "
     "caps 1, 2, 3), or both; wide (opt-in: the task cases of the wide launches, fp16/bf16 x under CUDA "
     "autocast with float32 y and dy, ids fwd-tasksw-... and bwd-tasksw-...) or all (tiles, tasks and wide). "
     "With --gn-arch-sweep the profiles get task cases too. Not for --gn-impl (there: tiles). Default: both"),
)  # fmt: skip

#: --gn-arch values and the architectures each selects.
ARCH_CHOICES = {
    "tiles": ("tiles",),
    "tasks": ("tasks",),
    "both": ("tiles", "tasks"),
    "wide": ("wide",),
    "all": ("tiles", "tasks", "wide"),
}

DEFAULT_IMPL = "gn_module.functional:group_norm"
OWN_IMPLS = (DEFAULT_IMPL, "gn_module:group_norm")


@dataclass(frozen=True)
class GnOptions:
    arch_sweep: bool = False
    profiles: str = ""
    max_resident: int | None = None
    impl: str = DEFAULT_IMPL
    seed: int = 0
    profiles_file: str = ""
    shapes: tuple[tuple[int, int], ...] | None = None  # None: the markers' defaults
    impl_on_command_line: bool = False  # --gn-impl given as an option (not only as an ini key)
    archs: tuple[str, ...] = ("tiles", "tasks")  # --gn-arch: the architectures the cases validate

    @property
    def foreign(self) -> bool:
        """True when the implementation under test is not gn_module's own."""
        return self.impl not in OWN_IMPLS


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("gn", "GroupNorm validation (pytest-gn)")
    for opt, ini, metavar, help_text in _SPECS:
        if metavar is None:
            group.addoption(opt, action="store_true", default=None, dest=ini, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            group.addoption(opt, action="store", default=None, dest=ini, metavar=metavar, help=help_text)
            parser.addini(ini, help_text, type="string", default="")
    parser.addini("gn_profiles_file", "TOML or JSON file with extra GPU profiles for the sweep", default="")


def _raw(config: pytest.Config, key: str) -> tuple[object, str]:
    """(value, where it came from): the command line beats the ini key."""
    value = config.getoption(key, default=None)
    if value is not None:
        return value, "--" + key.replace("_", "-")
    return config.getini(key), f"{key} (ini)"


def _int(text: str | int, what: str, minimum: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise pytest.UsageError(f"{what} expects an integer, got {text!r}") from None
    if value < minimum:
        raise pytest.UsageError(f"{what} must be >= {minimum}, got {value}")
    return value


def read_options(config: pytest.Config) -> GnOptions:
    """Options from the command line, falling back to ini keys; bad values raise UsageError
    naming where the value came from (the option or the ini key)."""
    from pytest_gn.cases import parse_shapes

    raw_impl, impl_from = _raw(config, "gn_impl")
    impl = str(raw_impl or "").strip() or DEFAULT_IMPL
    if not re.fullmatch(r"[\w.]+:[\w.]+", impl):
        raise pytest.UsageError(
            f"{impl_from} expects module:callable (e.g. mypkg.norm:group_norm), got {impl!r}"
        )
    cap, cap_from = _raw(config, "gn_max_resident")
    seed, seed_from = _raw(config, "gn_seed")
    shapes_text, shapes_from = _raw(config, "gn_shapes")
    shapes = None
    if str(shapes_text or "").strip():
        try:
            shapes = parse_shapes(str(shapes_text))
        except ValueError as exc:
            raise pytest.UsageError(f"{shapes_from} {exc}") from None
    cap_text, seed_text = str(cap or "").strip(), str(seed or "").strip()
    arch_text, arch_from = _raw(config, "gn_arch")
    arch = str(arch_text or "").strip().lower()
    if not arch:  # gn_module's defaults run both; another implementation has no task kernels
        arch = "both" if impl in OWN_IMPLS else "tiles"
    if arch not in ARCH_CHOICES:
        raise pytest.UsageError(f"{arch_from} expects one of {', '.join(ARCH_CHOICES)}, got {arch_text!r}")
    if arch != "tiles" and impl not in OWN_IMPLS:
        raise pytest.UsageError(
            f"{arch_from} {arch} selects gn_module's task kernels, which do not apply to --gn-impl {impl}; "
            "leave it at tiles"
        )
    return GnOptions(
        arch_sweep=bool(_raw(config, "gn_arch_sweep")[0]),
        profiles=str(_raw(config, "gn_profiles")[0] or "").strip(),
        max_resident=_int(cap_text, cap_from, 1) if cap_text else None,
        impl=impl,
        seed=_int(seed_text, seed_from, 0) if seed_text else 0,
        profiles_file=str(config.getini("gn_profiles_file") or "").strip(),
        shapes=shapes,
        impl_on_command_line=config.getoption("gn_impl", default=None) is not None,
        archs=ARCH_CHOICES[arch],
    )
