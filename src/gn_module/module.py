"""`GroupNorm`: a drop-in `torch.nn.GroupNorm` that runs the fast kernels (and can fuse SiLU)."""

from __future__ import annotations

import torch
from torch import nn

from gn_module.functional import ACTS, group_norm


class GroupNorm(nn.GroupNorm):
    """`torch.nn.GroupNorm` with the same parameters, init and state_dict keys, plus ``act``.

    ``act="silu"`` returns ``silu(group_norm(x))`` in one kernel. Subclassing `nn.GroupNorm`
    keeps ``isinstance`` checks, optimizers and checkpoints working unchanged.
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        act: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        bias: bool = True,
    ) -> None:
        if act not in ACTS:
            raise ValueError(f"GroupNorm: unsupported act {act!r}; expected one of {ACTS}")
        # `bias=` is newer than our torch floor (2.11): pass it only when it changes something.
        extra = {} if bias else {"bias": False}
        try:
            super().__init__(
                num_groups, num_channels, eps=eps, affine=affine, device=device, dtype=dtype, **extra
            )
        except TypeError as exc:
            if extra and "bias" in str(exc):
                msg = f"GroupNorm: bias=False needs a torch whose nn.GroupNorm has it ({exc})"
                raise TypeError(msg) from None
            raise
        self.act = act

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps, self.act)

    def extra_repr(self) -> str:
        text = super().extra_repr()
        return text if self.act is None else f"{text}, act={self.act!r}"
