"""GPU tests of the fused activations (issue 14): every act of `gn_module.functional.ACTS`, forward and
backward, against the fp64 reference with outputs and workspace poisoned (NaN), on the tile kernels
(``GN_ARCH=tiles``) and on gn_module's default architecture; bitwise equality across residency caps and
schedules; "identity" bitwise None; and models converted with ReLU / GELU fused.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gn_module
from gn_module import ops
from gn_module.functional import ACTS

from .test_kernels import check_against_reference, make_case, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: "default": no GN_ARCH, whatever gn_module runs by default (the task kernels since session 6).
ARCHS = ["tiles", "default"]
#: The vectorized path (C=64, 8 channels per group) and the scalar one (C=30, 3 per group), partial tiles.
SHAPES = [((2, 64, 40, 24), 8), ((3, 30, 17, 19), 10)]


@pytest.fixture(autouse=True)
def _poison():
    with ops.poison_outputs():
        yield


@pytest.fixture(params=ARCHS)
def arch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "default":
        monkeypatch.delenv(ops.ENV_ARCH, raising=False)
    else:
        monkeypatch.setenv(ops.ENV_ARCH, request.param)
    return request.param


def _shape_id(value: object) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else f"G{value}"


@pytest.mark.parametrize("act", ACTS, ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("cap", [3, None], ids=["cap3", "natural"])
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=_shape_id)
def test_act_against_fp64(arch, shape, groups, dtype, act, passes, cap):
    # A mean of 0.5 puts both signs (and ReLU's kink) into every group.
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], torch.float32, mean=0.5)
    with ops.launch_record() as rec:
        if cap is None:
            check_against_reference(x, groups, w, b, act, passes, dy)
        else:
            with gn_module.max_resident_blocks(cap):
                check_against_reference(x, groups, w, b, act, passes, dy)
    assert set(rec) == {"fwd", "bwd"}, "the kernels did not run (torch's path instead?)"
    assert rec["fwd"]["tiles_applied"] == rec["fwd"]["plan"].tiles
    assert rec["bwd"]["tiles_applied"] == rec["bwd"]["plan"].tiles


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_act_bitwise_equal_across_caps_and_schedules(arch, act, dtype):
    shape, groups = (2, 128, 96, 80), 16
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], torch.float32, mean=0.5)
    baseline = run(x, groups, w, b, act, 2, dy)
    for passes in (1, 2):
        for cap in (1, 2, 7, 33, None):
            if cap is None:
                got = run(x, groups, w, b, act, passes, dy)
            else:
                with gn_module.max_resident_blocks(cap):
                    got = run(x, groups, w, b, act, passes, dy)
            for name, g, ref in zip(("y", "dx", "dw", "db"), got, baseline, strict=True):
                assert torch.equal(g, ref), f"{name} differs with act={act} passes={passes} cap={cap}"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_identity_is_bitwise_no_act(arch, dtype):
    x, w, b, dy = make_case((2, 64, 20, 20), 8, DTYPES[dtype])
    none = run(x, 8, w, b, None, "auto", dy)
    identity = run(x, 8, w, b, "identity", "auto", dy)
    for a, e in zip(identity, none, strict=True):
        assert torch.equal(a, e)


@pytest.mark.parametrize("act", ACTS, ids=lambda a: a or "noact")
def test_no_affine_with_act(arch, act):
    x, _, _, dy = make_case((2, 64, 17, 19), 4, torch.float16, affine=False, mean=0.5)
    check_against_reference(x, 4, None, None, act, 1, dy)


def test_converted_model_with_relu_and_gelu_runs_the_kernels(arch, no_tf32):
    """nn.Sequential GroupNorm -> ReLU (in place) / GELU / GELU(tanh) and timm-style GroupNormAct are
    fused; fp32 outputs and gradients match the unconverted model."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(16, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(inplace=True),
        nn.Conv2d(64, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.GELU(),
        nn.Conv2d(64, 64, 1), nn.GroupNorm(16, 64), nn.GELU(approximate="tanh"),
    ).cuda().to(memory_format=torch.channels_last)  # fmt: skip
    ref = copy.deepcopy(model)
    model, report = gn_module.convert_groupnorm(model)  # the default fuses every act
    assert report.fused == ["1", "4", "7"] and [model[i].act for i in (1, 4, 7)] == [
        "relu",
        "gelu",
        "gelu_tanh",
    ]
    x = torch.randn(4, 16, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    with ops.launch_record() as rec:
        y = model(x)
        y.square().mean().backward()
    assert set(rec) == {"fwd", "bwd"}
    y_ref = ref(x)
    y_ref.square().mean().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=n)
