"""Where a kernel's instructions and stalls go, from Nsight Compute's per-SASS-instruction counters.

    ncu --clock-control none -k regex:fwd_task_onepass -c 1 --section SourceCounters --page source --csv \\
        --print-source sass python3 scripts/profile_tasks.py --once > src.csv     # (GN_PROFILE_SHAPES=...)
    python scripts/sass_hotspots.py src.csv [--top 25] [--show ADDRESS]

Consecutive instructions with the same execution count are one basic block (a loop body, a prologue, a
branch's side). Prints the kernel's warp instructions and stall samples, the opcodes' shares, and the
blocks that issue most (executions x instructions) with their stall samples and opcode mix; `--show` prints
the SASS of the block at ADDRESS. No GPU, no torch: it reads the file only. Session 69 read the mid row's
forward with it (benchmarks/RESULTS.md): the SiLU apply's block is 35 % of the instructions.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclass
class Block:
    """Consecutive SASS instructions executed the same number of times."""

    address: str
    executions: int
    samples: int = 0
    sass: list[str] = field(default_factory=list)

    @property
    def issued(self) -> int:
        return self.executions * len(self.sass)


def opcode(sass: str) -> str:
    """The opcode without its predicate and modifiers: '@!P1 FSETP.GT.AND P3, ...' -> 'FSETP'."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def _count(text: str) -> int:
    return int(text.replace(",", "") or 0)


def read_source_page(path: Path) -> tuple[str, list[list[str]], list[str]]:
    """(kernel name, instruction rows, header) of the first kernel in an ncu `--page source --csv` file (ncu's
    own messages and any later kernels' pages are skipped)."""
    rows = list(csv.reader(path.read_text().splitlines()))
    kernel = next((r[1] for r in rows if len(r) > 1 and r[0] == "Kernel Name"), "?")
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError(f"{path}: no 'Address' header (an ncu --page source --csv file?)")
    header = rows[start]
    body = []
    for r in rows[start + 1 :]:
        if len(r) != len(header) or not re.match(r"^0x[0-9a-fA-F]+$", r[0]):
            break  # (the next kernel's page, or ncu's trailing messages)
        body.append(r)
    return kernel, body, header


def blocks_of(rows: list[list[str]], header: list[str]) -> list[Block]:
    executed, samples = header.index(EXECUTED), header.index(SAMPLES)
    blocks: list[Block] = []
    for r in rows:
        n = _count(r[executed])
        if not blocks or blocks[-1].executions != n:
            blocks.append(Block(r[0], n))
        blocks[-1].samples += _count(r[samples])
        blocks[-1].sass.append(r[1].strip())
    return blocks


def report(blocks: list[Block], kernel: str, top: int) -> str:
    issued = sum(b.issued for b in blocks) or 1
    samples = sum(b.samples for b in blocks) or 1
    ops: Counter[str] = Counter()
    op_samples: Counter[str] = Counter()
    for b in blocks:
        for s in b.sass:
            ops[opcode(s)] += b.executions
        # (a block's samples go to its opcodes in proportion to their count in it)
        for op, n in Counter(opcode(s) for s in b.sass).items():
            op_samples[op] += b.samples * n / len(b.sass)
    lines = [f"{kernel}: {issued} warp instructions, {samples} stall samples, {len(blocks)} blocks"]
    lines.append("opcodes (share of instructions, share of samples):")
    for op, n in ops.most_common(16):
        lines.append(f"  {op:<10} {100 * n / issued:5.1f} %  {100 * op_samples[op] / samples:5.1f} %")
    lines.append(f"blocks issuing most (of {len(blocks)}):")
    for b in sorted(blocks, key=lambda b: -b.issued)[:top]:
        mix = ", ".join(f"{op} {n}" for op, n in Counter(opcode(s) for s in b.sass).most_common(6))
        share = (
            f"{100 * b.issued / issued:4.1f} % of instructions, {100 * b.samples / samples:4.1f} % of samples"
        )
        lines.append(f"  {b.address}  {b.executions:>8} x {len(b.sass):>4} = {share}  ({mix})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path, help="ncu's --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=25, help="blocks to list (default 25)")
    ap.add_argument("--show", metavar="ADDRESS", help="print the SASS of the block starting at ADDRESS")
    args = ap.parse_args(argv)
    kernel, rows, header = read_source_page(args.csv)
    blocks = blocks_of(rows, header)
    if args.show:
        found = [b for b in blocks if b.address == args.show]
        if not found:
            print(f"no block starts at {args.show}", file=sys.stderr)
            return 1
        print(f"{found[0].address}: executed {found[0].executions} times")
        print("\n".join(found[0].sass))
        return 0
    print(report(blocks, kernel, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
