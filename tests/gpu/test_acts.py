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
from gn_module import ops, reference
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


#: C = 48 in 16 groups: 3 channels per group, so the 8 channels of a thread's 16-byte vector (and each pair of
#: them) straddle groups, and a group's NaN must stay out of its neighbours' elements.
NAN_SHAPE, NAN_GROUPS = (2, 48, 6, 7), 16


def _masks_equal(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    g, r = got.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.equal(torch.isnan(g), torch.isnan(r)), f"{what}: NaN at other places than torch's"
    inf = torch.isinf(r)
    same_inf = torch.equal(torch.isinf(g), inf) and torch.equal(g[inf], r[inf])
    assert same_inf, f"{what}: infinities differ from torch's"


@pytest.mark.parametrize("act", ACTS, ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_nan_stays_in_its_group_like_torch(arch, act, dtype):
    """A NaN in x makes its group's y and dx NaN, and its channels' dweight and dbias, as torch's GroupNorm
    and activation do (a fused ReLU that turned NaN into 0 would hide a diverging model), and nothing else."""
    x, w, b, dy = make_case(NAN_SHAPE, NAN_GROUPS, DTYPES[dtype], torch.float32, mean=0.5)
    x[0, 3, 2, 2] = float("nan")  # channel 3: group 1 of sample 0
    for passes in (1, 2):
        got = run(x, NAN_GROUPS, w, b, act, passes, dy)
        ref = reference.forward_backward(x, NAN_GROUPS, w, b, 1e-5, act, dy)
        for name, g, r in zip(("y", "dx", "dweight", "dbias"), got, ref, strict=True):
            _masks_equal(g, r, f"{name} (act={act}, passes={passes})")
        finite = torch.isfinite(ref[0]).to(got[0].device)
        assert finite.any() and not finite.all()
        outside = ref[0][finite.to(ref[0].device)]
        reference.compare(got[0][finite], outside, DTYPES[dtype], "y outside the NaN group")


#: Pre-activations z = b (weight 0): NaN, the infinities, and values far into every activation's tails (SiLU's
#: exp(-z) overflows float32 below -88; sigmoids of |z| > 43.6 are beyond 2^-63).
EXTREMES = (float("nan"), float("-inf"), float("inf"), -100.0, -50.0, -20.0, -1.0, 0.0, 1.0, 20.0, 100.0, 3e4)


@pytest.mark.parametrize("act", ACTS, ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_act_at_extreme_pre_activations_like_torch(arch, act, dtype):
    """With weight 0 every element of channel c has z = bias[c] exactly: y, dx, dweight and dbias at NaN,
    +-inf and far tails against torch's own activation (fp64): the same NaNs and infinities, the finite
    values within the dtype's tolerance."""
    x, _, _, dy = make_case(NAN_SHAPE, NAN_GROUPS, DTYPES[dtype], torch.float32)
    c = NAN_SHAPE[1]
    w = torch.zeros(c, device="cuda")
    b = torch.tensor([EXTREMES[i % len(EXTREMES)] for i in range(c)], device="cuda")
    for passes in (1, 2):
        got = run(x, NAN_GROUPS, w, b, act, passes, dy)
        ref = reference.forward_backward(x, NAN_GROUPS, w, b, 1e-5, act, dy)
        for name, g, r in zip(("y", "dx", "dweight", "dbias"), got, ref, strict=True):
            _masks_equal(g, r, f"{name} (act={act}, passes={passes})")
            finite = torch.isfinite(r).to(g.device)
            if finite.any():
                # (float32 weight and bias: their gradients at float16's tolerance, as in test_kernels)
                rdtype = DTYPES[dtype] if name in ("y", "dx") else torch.float16
                what = f"{name} (act={act}, passes={passes})"
                reference.compare(g[finite], r[finite.to(r.device)], rdtype, what)
