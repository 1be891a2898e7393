"""The C++ autograd node prototype (benchmarks/micro/cpp_node.cpp) still builds, and on CPU launches with
the same GnArgs as the Python route (`cpp_node_host.py --cpu` checks the bytes of a step of each against
stub entry points, then times them: the timing is not judged here).

It runs on a GPU only when a session measures the training step's host time, so a build or packing error
would otherwise surface in the middle of a session's device time. Skips without a C++ compiler or ninja.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "micro" / "cpp_node_host.py"


def test_node_builds_and_packs_as_the_python_route(tmp_path: Path) -> None:
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler")
    pytest.importorskip("ninja", reason="torch.utils.cpp_extension needs ninja")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--calls", "5", "--rounds", "1"]
    cmd += ["--build-dir", str(tmp_path / "build"), "--json", str(tmp_path / "rows.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "packing: the node's GnArgs equal the Python route's" in done.stdout
    rows = (tmp_path / "rows.json").read_text()
    for label in ("python route", "C++ node alone", "engine floor"):
        assert label in rows, label
