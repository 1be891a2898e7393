"""Plain PyTorch: swap a model's GroupNorm layers for gn_module's, train a little, swap back.

    python examples/convert_model.py

The converted layers reuse the model's Parameters, so an optimizer created before the swap keeps
working and state_dict keys do not change. On a CUDA device with channels_last inputs the fast
kernels run; elsewhere torch's own GroupNorm does, with the same results.
"""

from __future__ import annotations

import torch
from torch import nn

from gn_module import convert_groupnorm, revert_groupnorm


def make_model() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1),
        nn.GroupNorm(32, 64),
        nn.SiLU(),  # fused into the GroupNorm above; its slot becomes an nn.Identity
        nn.Conv2d(64, 64, 3, padding=1),
        nn.GroupNorm(32, 64),  # followed by a conv, not a SiLU: swapped, not fused
        nn.Conv2d(64, 3, 1),
    )


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = make_model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # created before the swap on purpose
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 3, 32, 32, device=device)
    before = model(x)

    model, report = convert_groupnorm(model)
    print(f"convert_groupnorm: {report}")
    print(model)
    assert list(model.state_dict()) == list(reference)
    torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-4)

    # channels_last makes conv outputs (the GroupNorm inputs) channels-last: the fast path's layout.
    model = model.to(memory_format=torch.channels_last)
    x = x.contiguous(memory_format=torch.channels_last)
    for step in range(3):
        loss = (model(x) - x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")

    model, report = revert_groupnorm(model)
    print(f"revert_groupnorm: {report}")
    print(f"back to torch.nn layers: {[type(m).__name__ for m in model]}")


if __name__ == "__main__":
    main()
