"""The stub GPU of the launch-option tests (tests/test_dependent_launch.py, tests/test_cluster_teams.py):
scripts/host_overhead.py's recording library and H200-like device, with the build's __CUDA_ARCH__ chosen."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("host_overhead", ROOT / "scripts" / "host_overhead.py")
host_overhead = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(host_overhead)  # type: ignore[union-attr]


class ArchStub(host_overhead.PyStubLibrary):
    """The stub library of a build whose kernels run as `cuda_arch` (900: sm_90 code)."""

    def __init__(self, cuda_arch: int) -> None:
        super().__init__()
        self.cuda_arch = cuda_arch

    def gn_runtime_arch(self, index: int, out: object) -> int:
        out._obj.value = self.cuda_arch  # type: ignore[attr-defined]
        return 0
