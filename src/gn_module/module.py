"""`GroupNorm`: a drop-in `torch.nn.GroupNorm` that runs the fast kernels (and can fuse an activation)."""

from __future__ import annotations

import torch
from torch import nn

from gn_module.functional import ACTS, AUTOCAST_OUTPUTS, AutocastOutput, group_norm


class GroupNorm(nn.GroupNorm):
    """`torch.nn.GroupNorm` with the same parameters, init and state_dict keys, plus ``act``.

    ``act`` (one of `gn_module.functional.ACTS`) is applied in the same kernel: "silu" returns
    ``silu(group_norm(x))``, "relu", "gelu" (erf, ``F.gelu``'s default) and "gelu_tanh"
    (``F.gelu(approximate="tanh")``) likewise; None and "identity" apply none. The repr shows a
    non-None ``act`` after torch's fields (``GroupNorm(32, 320, ..., act='relu')``). Subclassing
    `nn.GroupNorm` keeps ``isinstance`` checks, optimizers and checkpoints working unchanged. Under
    CUDA autocast the output is float32, as torch's; ``autocast_output="input"`` keeps the input's
    dtype (see `gn_module.group_norm`).
    """

    #: a class default, so modules converted in place (class changed) and old pickles have it
    autocast_output: AutocastOutput = "float32"

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
        autocast_output: AutocastOutput = "float32",
    ) -> None:
        if act not in ACTS:
            raise ValueError(f"GroupNorm: unsupported act {act!r}; expected one of {ACTS}")
        if autocast_output not in AUTOCAST_OUTPUTS:
            raise ValueError(
                f"GroupNorm: autocast_output must be one of {AUTOCAST_OUTPUTS}, got {autocast_output!r}"
            )
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
        if autocast_output != "float32":
            self.autocast_output = autocast_output

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return group_norm(
            input,
            self.num_groups,
            self.weight,
            self.bias,
            self.eps,
            self.act,
            autocast_output=self.autocast_output,
        )

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.act is not None:
            text += f", act={self.act!r}"
        if self.autocast_output != "float32":
            text += f", autocast_output={self.autocast_output!r}"
        return text
