"""Chain floors: a small shape's measured limit beyond the copy floor, from `scripts/chain_floor.py`'s JSON.

A GroupNorm cannot write before it has reduced: a read, a reduction across the blocks of a task and a write
form a chain that a small tensor cannot hide behind bandwidth. `scripts/chain_floor.py` times that chain alone
(a bare one-launch GroupNorm swept over task windows, cluster sizes and block sizes, each geometry checked
against fp64) and writes its fastest geometry per row. `python -m gn_module.bench --chain-floors PATH` reads
that file, and a latency or SOL target the chain floor rules out becomes 90 % of it, like the copy floor's
(`floor.limit_adjusted`).

Two rules keep the file honest:
- it must come from the device the benchmark runs on (floors do not carry between GPUs), or loading raises;
- a row whose chain floor is slower than ours in the same chain_floor run is not a floor (the bare kernel
  found no good geometry there) and is left out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gn_module.bench.cases import Case

#: Groups of a chain_floor shape spec without ':G<n>' (scripts/time_shapes.parse's default).
DEFAULT_GROUPS = 32
_SPEC = re.compile(r"^(?P<shape>\d+(?:x\d+){2,})(?P<opts>(?::[A-Za-z0-9]+)*)$")


class ChainFloorError(ValueError):
    """A chain-floor file that cannot judge this run: unreadable, malformed, or from another device."""


@dataclass(frozen=True)
class ChainFloors:
    """The chain floors of one file: us by (case name, dtype, direction), and the rows left out, with why."""

    device: str
    us: dict[tuple[str, str, str], float]
    skipped: dict[tuple[str, str, str], str]


def case_name(spec: str) -> str:
    """'2x1280x16x16:silu' or '2x1280x16x16:G32:silu' -> the benchmark's case name '2x1280x16x16-G32-silu'."""
    m = _SPEC.match(spec.strip())
    if m is None:
        raise ChainFloorError(f"cannot read chain_floor shape {spec!r}; expected e.g. '2x1280x16x16:silu'")
    groups, act = DEFAULT_GROUPS, None
    for opt in filter(None, m["opts"].split(":")):
        if re.fullmatch(r"G\d+", opt):
            groups = int(opt[1:])
        elif opt == "silu":
            act = "silu"
        else:
            raise ChainFloorError(f"unknown option {opt!r} in chain_floor shape {spec!r}")
    try:
        return Case(tuple(int(v) for v in m["shape"].split("x")), groups, act).name
    except ValueError as exc:
        raise ChainFloorError(f"chain_floor shape {spec!r}: {exc}") from None


def parse_chain_floors(data: dict, device: str) -> ChainFloors:
    """The floors in `data` (chain_floor.py's JSON), checked to come from `device` (its CUDA name)."""
    try:
        source, rows = data["device"], data["rows"]
    except (KeyError, TypeError):
        raise ChainFloorError("not a chain_floor.py JSON: it needs 'device' and 'rows'") from None
    if source != device:
        raise ChainFloorError(
            f"the chain floors were measured on {source!r}, this run is on {device!r}; "
            "floors do not carry between GPUs (run scripts/chain_floor.py here)"
        )
    floors: dict[tuple[str, str, str], float] = {}
    skipped: dict[tuple[str, str, str], str] = {}
    for row in rows:
        try:
            key = (row.get("case") or case_name(row["shape"]), row["dtype"], row["direction"])
            best_us, ours_us = float(row["best"]["us"]), row.get("ours_us")
        except (KeyError, TypeError, ValueError) as exc:
            raise ChainFloorError(f"malformed chain_floor row {row!r}: {exc}") from None
        if not row["best"].get("ok", True):
            skipped[key] = "its best geometry failed the fp64 check"
        elif ours_us is not None and best_us > float(ours_us):
            skipped[key] = f"ours ({float(ours_us):.2f} us) beat it ({best_us:.2f} us): not a floor"
        else:
            floors[key] = best_us
    return ChainFloors(source, floors, skipped)


def load_chain_floors(path: str | Path, device: str) -> ChainFloors:
    """`parse_chain_floors` of the JSON file at `path`."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ChainFloorError(f"cannot read chain floors from {path}: {exc}") from None
    return parse_chain_floors(data, device)
