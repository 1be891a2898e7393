"""The benchmark shape table (issue 6), bytes accounting and size classes. Pure Python, no torch."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: The shapes of issue 6, in its own notation: NCHW (or NCDHW) sizes, groups, optional SiLU.
SHAPE_TABLE = """
1x128x1024x2048 G16
1x128x1024x1024 G32 +SiLU
1x256x512x512 G32 +SiLU
1x512x256x256 G32 +SiLU
1x512x128x128 G32 +SiLU
2x320x64x64 G32 +SiLU
2x640x32x32 G32 +SiLU
2x1280x16x16 G32 +SiLU
32x128x256x256 G32
1x128x16x256x256 G32 +SiLU
"""

#: One large (overflows the H200's residency), one mid and one small shape: the --quick subset.
QUICK_NAMES = ("1x128x1024x2048-G16", "1x512x128x128-G32-silu", "2x640x32x32-G32-silu")

DTYPES = ("fp16", "bf16")
#: Implementations timed side by side; "ours-auto" is the one the targets judge.
IMPLS = ("ours-auto", "ours-1pass", "ours-2pass", "eager", "compile-cl", "compile-nchw")
OURS = "ours-auto"
COMPILE_IMPLS = ("compile-cl", "compile-nchw")
#: Autocast rows (opt-in, --dtypes bf16-autocast): x in the 16-bit dtype named, weight and bias float32,
#: every implementation called under CUDA autocast, so y and dy are float32 as torch's GroupNorm gives
#: them there (ours: the wide launches; torch: x cast to float32, then its float32 kernels).
AUTOCAST_DTYPES = {"fp16-autocast": "fp16", "bf16-autocast": "bf16"}
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4, "fp16-autocast": 2, "bf16-autocast": 2}
ALL_DTYPES = ("fp16", "bf16", "fp32", *AUTOCAST_DTYPES)
DIRECTIONS = ("fwd", "bwd")
#: Minimum tensors moved: forward reads x, writes y; backward reads x and dy, writes dx.
TENSORS_MOVED = {"fwd": 2, "bwd": 3}
#: Bytes per element of y and dy in the autocast rows (float32).
AUTOCAST_WIDE_BYTES = 4

MIB = 1 << 20

_LINE = re.compile(r"^\s*(?P<shape>\d+(?:x\d+)+)\s+G(?P<groups>\d+)\s*(?P<act>\+\s*silu)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Case:
    """One benchmark shape: NC* sizes, groups, activation."""

    shape: tuple[int, ...]
    groups: int
    act: str | None = None

    def __post_init__(self) -> None:
        if len(self.shape) < 3:
            raise ValueError(f"benchmark shapes need N, C and at least one spatial size, got {self.shape}")
        if any(s < 1 for s in self.shape):
            raise ValueError(f"benchmark shape sizes must be positive, got {self.shape}")
        if self.groups < 1 or self.shape[1] % self.groups:
            raise ValueError(f"channels {self.shape[1]} not divisible by groups {self.groups}")
        if self.act not in (None, "silu"):
            raise ValueError(f"unsupported act {self.act!r}")

    @property
    def name(self) -> str:
        base = "x".join(map(str, self.shape)) + f"-G{self.groups}"
        return base + ("-silu" if self.act else "")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, dtype: str) -> int:
        """Bytes of one tensor of this shape."""
        return self.numel * itemsize(dtype)


def itemsize(dtype: str) -> int:
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(ITEMSIZE)}") from None


def parse_case(line: str) -> Case:
    """'1x128x1024x1024 G32 +SiLU' -> Case."""
    m = _LINE.match(line)
    if m is None:
        raise ValueError(f"cannot parse benchmark shape {line!r}; expected e.g. '1x128x64x64 G32 +SiLU'")
    shape = tuple(int(s) for s in m["shape"].split("x"))
    return Case(shape=shape, groups=int(m["groups"]), act="silu" if m["act"] else None)


def parse_table(text: str) -> list[Case]:
    """Parse a table of lines or ';'-separated entries; blank lines and '#' comments are skipped."""
    entries = (e.split("#", 1)[0] for line in text.splitlines() for e in line.split(";"))
    return [parse_case(e) for e in entries if e.strip()]


CASES: tuple[Case, ...] = tuple(parse_table(SHAPE_TABLE))


def configured_cases() -> tuple[Case, ...]:
    """The shapes benchmarks/ times: GN_BENCH_SHAPES (a table in SHAPE_TABLE's notation, entries
    separated by ';' or newlines) when set, else the issue's table."""
    table = os.environ.get("GN_BENCH_SHAPES", "").strip()
    return tuple(parse_table(table)) if table else CASES


def select_cases(
    patterns: Sequence[str] | None = None, *, quick: bool = False, cases: Iterable[Case] = CASES
) -> list[Case]:
    """Cases whose name contains any pattern (case-insensitive); --quick keeps QUICK_NAMES only.

    Every pattern must match a case: a shape that is not one of the benchmark's (a typo, or a shape meant
    for `scripts/time_shapes.py`) raises instead of silently timing fewer rows than asked for.
    """
    chosen = [c for c in cases if not quick or c.name in QUICK_NAMES]
    if patterns:
        pats = [p.strip().lower() for p in patterns if p.strip()]
        unmatched = [p for p in pats if not any(p in c.name.lower() for c in chosen)]
        if unmatched:
            raise ValueError(
                f"no benchmark shape matches {unmatched}"
                f"{' under --quick' if quick else ''}; known: {[c.name for c in chosen]}"
            )
        chosen = [c for c in chosen if any(p in c.name.lower() for p in pats)]
    return chosen


def bytes_moved(case: Case, dtype: str, direction: str) -> int:
    """Minimum bytes a GroupNorm must move (weights and statistics are negligible and left out). An
    autocast row's y and dy are float32: forward x + float32 y, backward x + float32 dy + dx."""
    if direction not in TENSORS_MOVED:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if dtype in AUTOCAST_DTYPES:
        wide = case.numel * AUTOCAST_WIDE_BYTES
        return (TENSORS_MOVED[direction] - 1) * case.nbytes(dtype) + wide
    return TENSORS_MOVED[direction] * case.nbytes(dtype)


def size_class(tensor_bytes: int) -> str | None:
    """Issue 6's size classes by one tensor's size: large >= 128 MiB, mid 8..64 MiB, small < 8 MiB.

    Tensors between 64 and 128 MiB belong to no class (no SOL or latency target applies).
    """
    if tensor_bytes >= 128 * MIB:
        return "large"
    if 8 * MIB <= tensor_bytes <= 64 * MIB:
        return "mid"
    if tensor_bytes < 8 * MIB:
        return "small"
    return None
