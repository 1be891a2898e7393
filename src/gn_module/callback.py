"""`GNSwapCallback`: put `gn_module.GroupNorm` into a LightningModule before training starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from gn_module.convert import ConversionReport, Patterns, check_options, convert_groupnorm, revert_groupnorm

# Strategies that shard parameters: swapping after `configure_model` could meet flattened or
# distributed parameters, so they are refused rather than risked.
_SHARDED_STRATEGIES = ("FSDPStrategy", "ModelParallelStrategy", "DeepSpeedStrategy")


class GNSwapCallback(Callback):
    """Swap the model's GroupNorm layers for the fast channels-last `gn_module.GroupNorm`.

    The swap runs once per ``fit``/``validate``/``test``/``predict``, after the LightningModule's
    ``setup`` and ``configure_model`` hooks (so layers created there are included) and after a
    checkpoint given as ``ckpt_path`` has been loaded into the model, but before the strategy moves
    the model, applies the precision plugin, wraps it (DDP) and builds the optimizers. The swapped
    layers reuse the original Parameters, so state_dict keys are unchanged: checkpoints load into the
    plain model and vice versa with ``strict=True``.

    Args:
        channels_last: convert 4-D/5-D parameters and buffers to channels_last(_3d), so that conv
            outputs (and hence GroupNorm inputs) are channels-last, which the fast kernels need.
        fuse_silu, include, exclude, min_channels: passed to `gn_module.convert_groupnorm`.
        restore_on_teardown: put the original layers (and memory format) back when the stage ends.
        log_hyperparams: record the counts in every logger's hyperparameters.
    """

    def __init__(
        self,
        *,
        channels_last: bool = True,
        fuse_silu: bool = True,
        include: Patterns = None,
        exclude: Patterns = None,
        min_channels: int = 0,
        restore_on_teardown: bool = False,
        log_hyperparams: bool = True,
    ) -> None:
        super().__init__()
        check_options(include, exclude, min_channels)  # fail at construction, not mid-fit
        self.channels_last = channels_last
        self.convert_kwargs: dict[str, Any] = {
            "fuse_silu": fuse_silu,
            "include": include,
            "exclude": exclude,
            "min_channels": min_channels,
        }
        self.restore_on_teardown = restore_on_teardown
        self.log_hyperparams = log_hyperparams
        self.report: ConversionReport | None = None
        self._unpatch: Callable[[], None] | None = None
        self._made_channels_last = False

    # -- Lightning hooks ------------------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        sharded = [c.__name__ for c in type(trainer.strategy).__mro__ if c.__name__ in _SHARDED_STRATEGIES]
        if sharded:
            raise RuntimeError(
                f"GNSwapCallback does not support {sharded[0]} (it shards parameters). Call "
                "gn_module.convert_groupnorm(...) on your layers in LightningModule.configure_model, "
                "before they are sharded, instead of using the callback."
            )
        self._defer_swap_to_strategy_setup(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._remove_patch()
        if self.restore_on_teardown:
            _, report = revert_groupnorm(pl_module)
            if self._made_channels_last:
                _set_memory_format(pl_module, channels_last=False)
                self._made_channels_last = False
            rank_zero_info(f"GNSwapCallback: restored {len(report.swapped)} GroupNorm layers")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_patch()

    # -- the swap -------------------------------------------------------------------------------

    def _defer_swap_to_strategy_setup(self, trainer: Trainer) -> None:
        # Lightning has no callback hook between `configure_model` and `strategy.setup` (which moves,
        # converts, wraps the model and creates the optimizers), so the callback runs its swap at the
        # start of this trainer's `strategy.setup` call and removes itself right away.
        self._remove_patch()
        strategy = trainer.strategy
        had_own = "setup" in vars(strategy)
        original = strategy.setup

        def setup_after_swap(trainer_: Trainer) -> None:
            self._remove_patch()
            self.swap(trainer_, trainer_.lightning_module)
            original(trainer_)

        def unpatch() -> None:
            if had_own:
                strategy.setup = original
            else:
                del strategy.setup

        strategy.setup = setup_after_swap
        self._unpatch = unpatch

    def _remove_patch(self) -> None:
        if self._unpatch is not None:
            unpatch, self._unpatch = self._unpatch, None
            unpatch()

    def swap(self, trainer: Trainer, pl_module: LightningModule) -> ConversionReport:
        """Convert ``pl_module`` in place now; called by the callback, public for manual use."""
        _, report = convert_groupnorm(pl_module, **self.convert_kwargs)
        if self.channels_last:  # every time: layers may have been added since the last stage
            self._made_channels_last |= _set_memory_format(pl_module, channels_last=True)
        if report.swapped or self.report is None:
            self.report = report
            self._log(trainer, report)
        return report

    def _log(self, trainer: Trainer, report: ConversionReport) -> None:
        counts = report.summary()
        rank_zero_info(f"GNSwapCallback: {report}")
        if self.log_hyperparams and trainer.is_global_zero:
            params = {f"gn_swap/{key}": value for key, value in counts.items()}
            params["gn_swap/channels_last"] = self.channels_last
            for logger in trainer.loggers:
                logger.log_hyperparams(params)


def _set_memory_format(module: nn.Module, *, channels_last: bool) -> bool:
    """Restride 4-D/5-D parameters and buffers in place (Parameter objects are kept)."""
    changed = False
    for tensor in [*module.parameters(), *module.buffers()]:
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())
        if fmt is None:
            continue
        fmt = fmt if channels_last else torch.contiguous_format
        if not tensor.is_contiguous(memory_format=fmt):
            tensor.data = tensor.data.contiguous(memory_format=fmt)
            changed = True
    return changed
