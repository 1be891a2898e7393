"""torch.compile under CUDA autocast: a float16/bfloat16 x reaches the custom op as it is (its wide form:
float32 y, dx in x's dtype), with no float32 copy of x in the graph.

Compiled against eager, which runs the same kernels under the same plan: bitwise equal, forward and
backward; and against the fp64 reference. Where the kernels have no wide launch (C=30: no 16-byte
vectors), both take the float32 copy of x, and still agree bitwise. Outputs and workspace are poisoned.
"""

from __future__ import annotations

import pytest
import torch

import gn_module
from gn_module import ops, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CASES = [((2, 64, 16, 16), 32), ((3, 96, 7, 5), 32), ((2, 30, 6, 6), 10)]


@pytest.fixture(autouse=True)
def _poison():
    with ops.poison_outputs():
        yield


def _graph_capture(graphs: list) -> object:
    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    return backend


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("shape", "groups"), CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"G{v}"
)
def test_compiled_autocast_is_eagers_float32_groupnorm(shape, groups, dtype):
    torch._dynamo.reset()
    c = shape[1]
    m = gn_module.GroupNorm(groups, c, act="silu").cuda()
    with torch.no_grad():
        m.weight.normal_()
        m.bias.normal_()
    x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    compiled = torch.compile(m, fullgraph=True)
    with torch.autocast("cuda", dtype=dtype):
        y = m(x)
        yc = compiled(x)
    assert y.dtype == yc.dtype == torch.float32  # torch's GroupNorm under autocast
    assert yc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(yc, y)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, m.weight, m.bias), dy)
    grads_c = torch.autograd.grad(yc, (x, m.weight, m.bias), dy)
    assert grads_c[0].dtype == dtype
    for g, gc in zip(grads, grads_c, strict=True):
        assert torch.equal(gc, g)
    w, b = m.weight.detach().double(), m.bias.detach().double()
    ref = reference.forward(x.detach().double(), groups, w, b, 1e-5, "silu")
    torch.testing.assert_close(yc.double(), ref, rtol=1e-4, atol=1e-4)


def test_the_compiled_graph_passes_x_uncast_to_the_wide_op():
    """Where the kernels have a wide launch, the graph dynamo captures calls the custom op on the
    bfloat16 x with wide=True and converts nothing to float32 (the old route cast x first)."""
    torch._dynamo.reset()
    graphs: list = []
    m = gn_module.GroupNorm(32, 64).cuda()
    x = torch.randn(2, 64, 16, 16, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    compiled = torch.compile(m, backend=_graph_capture(graphs), fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = compiled(x)
    assert y.dtype == torch.float32
    (gm,) = graphs
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    ops_ = [n for n in calls if "group_norm_fwd" in str(n.target)]
    assert len(ops_) == 1
    op = ops_[0]
    assert op.kwargs.get("wide", op.args[7] if len(op.args) > 7 else False) is True
    assert op.args[0].op == "placeholder"  # x itself, no cast in between
    casts = [n for n in calls if "to" in str(n.target) or "float" in str(n.target)]
    assert not casts, [str(n.target) for n in casts]
