"""Copy csrc/ to a temporary folder whose C entry points launch every kernel twice; print its path.

    GN_CSRC_DIR=$(python scripts/plant_slowdown.py) bash scripts/gpu_check.sh LOGDIR

The planted copy does all GPU work of gn_forward/gn_backward two times (results are unchanged: each
launch recomputes the same outputs), so our medians double while eager and torch.compile stay put.
It shows that the benchmark gate fails and names our benchmarks. A host-side sleep would not show:
the timer queues each call behind a GPU-side spin and times GPU work only. Exits non-zero if an entry
point is gone.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

ENTRIES = {"gn_forward.cu": "gn_forward", "gn_backward.cu": "gn_backward"}


def plant(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
    for filename, entry in ENTRIES.items():
        path = dst / filename
        text = path.read_text()
        site = f'extern "C" int {entry}(const GnArgs* args, void* stream) {{'
        if text.count(site) != 1:
            raise SystemExit(
                f"plant_slowdown.py: the entry point {entry} in {filename} moved; update ENTRIES"
            )
        once = f"{entry}_once_planted"
        text = text.replace(site, f"static int {once}(const GnArgs* args, void* stream) {{")
        text += (
            f"\n// PLANTED (scripts/plant_slowdown.py): every call does its GPU work twice.\n"
            f'extern "C" int {entry}(const GnArgs* args, void* stream) {{\n'
            f"  const int err = {once}(args, stream);\n"
            f"  return err != 0 ? err : {once}(args, stream);\n"
            f"}}\n"
        )
        path.write_text(text)


def main() -> int:
    dst = Path(tempfile.mkdtemp()) / "csrc"
    plant(Path(__file__).resolve().parents[1] / "csrc", dst)
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
