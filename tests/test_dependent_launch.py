"""Programmatic dependent launches of the two-launch task schedules (on by default), without a GPU: when the
launch asks for one (GnArgs.dependent_launch), and that the setting reaches a cached launch.

The stub library (scripts/host_overhead.py) records launches; here it also reports the build's
__CUDA_ARCH__, since griddepcontrol exists only in sm_90 code: a compute_80 PTX build that ran with the
flag would let its apply launch read the statistics before the stats launch wrote them.
The bits with and without the flag are compared on a GPU in tests/gpu/test_dependent_launch.py.
"""

from __future__ import annotations

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH, ops.ENV_DEPENDENT):
        monkeypatch.delenv(name, raising=False)


def flag(direction: str, passes: int, cuda_arch: int = 900, shape=(2, 64, 8, 8)) -> int:
    """GnArgs.dependent_launch of the launch `passes` (1 or 2) plans for `shape` on a stub GPU."""
    x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(cuda_arch)):
        launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 0, passes, None)
        assert launch.plan.schedule == passes
        return _abi.GnArgs.from_buffer_copy(launch.args).dependent_launch


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_on_by_default_and_off_when_asked(direction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert flag(direction, 2) == 1
    with ops.dependent_launches(False):
        assert flag(direction, 2) == 0
    monkeypatch.setenv(ops.ENV_DEPENDENT, "0")
    assert flag(direction, 2) == 0


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_two_launches_on_sm90_code_ask_for_it(direction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with ops.dependent_launches():
        assert flag(direction, 2) == 1
        # one cooperative launch (the backward's needs GN_ARCH=tasks+bwd1): nothing to overlap
        monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd1")
        assert flag(direction, 1) == 0


@pytest.mark.parametrize("cuda_arch", [800, 860, 890])
def test_never_for_code_below_sm90(cuda_arch: int) -> None:
    # the compute_80 PTX variant JIT-compiled on an H200 reports 800: its apply has no wait
    with ops.dependent_launches():
        assert flag("fwd", 2, cuda_arch) == 0
        assert flag("bwd", 2, cuda_arch) == 0


def test_environment_and_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ops.ENV_DEPENDENT, "1")
    assert ops.dependent_launches_enabled() and flag("fwd", 2) == 1
    with ops.dependent_launches(False):
        assert not ops.dependent_launches_enabled() and flag("fwd", 2) == 0
        with ops.dependent_launches(True):
            assert flag("fwd", 2) == 1
    monkeypatch.setenv(ops.ENV_DEPENDENT, "0")
    assert not ops.dependent_launches_enabled() and flag("fwd", 2) == 0


def test_the_setting_is_part_of_the_cached_launch() -> None:
    x = torch.randn(2, 64, 8, 8).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        with ops.dependent_launches(False):
            plain = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 2, None)
        dependent = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 2, None)
        with ops.dependent_launches(False):
            assert ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 2, None) is plain
    assert dependent is not plain
    assert _abi.GnArgs.from_buffer_copy(plain.args).dependent_launch == 0
    assert _abi.GnArgs.from_buffer_copy(dependent.args).dependent_launch == 1


def test_only_a_bool_turns_it_on() -> None:
    with pytest.raises(TypeError, match="bool"), ops.dependent_launches("yes"):  # type: ignore[arg-type]
        pass


class CountingArchStub(ArchStub):
    def __init__(self, cuda_arch: int) -> None:
        super().__init__(cuda_arch)
        self.asked = 0

    def gn_runtime_arch(self, index: int, out: object) -> int:
        self.asked += 1
        return super().gn_runtime_arch(index, out)


def test_the_runtime_arch_is_asked_once_per_library() -> None:
    # asking runs a kernel and a synchronous copy: never per plan (nor inside a CUDA-graph capture later)
    stub = CountingArchStub(900)
    with host_overhead.cpu_device(stub):
        for shape in ((2, 64, 8, 8), (2, 640, 32, 32), (4, 640, 32, 32)):
            x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
            for direction in ("fwd", "bwd"):
                ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 0, 0, None)
        assert stub.asked == 1  # six plans and their launches (CPU tensors: device index -1)
        assert ops.runtime_cuda_arch(0) == 900 and ops.runtime_cuda_arch(0) == 900
    assert stub.asked == 2  # (another device index is asked for itself, once)
    other = CountingArchStub(800)  # another library (another build variant) is asked for itself
    with host_overhead.cpu_device(other):
        assert ops.runtime_cuda_arch(0) == 800
    assert other.asked == 1
