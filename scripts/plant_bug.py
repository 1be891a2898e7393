"""Copy csrc/ to a temporary folder with a bug planted in the one-pass backward, print its path.

    python scripts/plant_bug.py all-archs   # every overflow tile skips the reductions
    python scripts/plant_bug.py sm80        # the first overflow tile skips them, on sm_80 only

Used by planted_bug.sh and planted_sm80_sweep.sh (point GN_CSRC_DIR at the printed folder) to
show that the tests can fail. Exits non-zero if the planting site is gone.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

SITE = (
    "    bwd_tile<T, V, kBatchOnepassBackward>(a, t, is_last ? keep_x : nullptr, "
    "is_last ? keep_dy : nullptr, scratch);"
)
BUGS = {
    "all-archs": "    if (t >= gridDim.x) continue;  // PLANTED: overflow tiles skip the reductions\n",
    "sm80": (
        "#if __CUDA_ARCH__ == 800\n"
        "    if (t == gridDim.x) continue;  // PLANTED: first overflow tile skips them\n"
        "#endif\n"
    ),
}


def main() -> int:
    if len(sys.argv) != 2 or sys.argv[1] not in BUGS:
        print(f"usage: plant_bug.py {{{','.join(BUGS)}}}", file=sys.stderr)
        return 2
    bad = Path(tempfile.mkdtemp()) / "csrc"
    shutil.copytree(Path(__file__).resolve().parents[1] / "csrc", bad)
    source = bad / "gn_backward.cu"
    text = source.read_text()
    if SITE not in text:
        print("plant_bug.py: the planting site in gn_backward.cu moved; update SITE", file=sys.stderr)
        return 1
    source.write_text(text.replace(SITE, BUGS[sys.argv[1]] + SITE))
    print(bad)
    return 0


if __name__ == "__main__":
    sys.exit(main())
