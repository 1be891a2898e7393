"""`GNSwapCallback`: put `gn_module.GroupNorm` into a LightningModule before training starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, Strategy
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn
from typing_extensions import override

from gn_module.convert import (
    DEFAULT_FUSE_ACTS,
    ConversionReport,
    FuseActs,
    Patterns,
    check_options,
    convert_groupnorm,
    materialize_fuse_acts,
    revert_groupnorm,
)
from gn_module.functional import AutocastOutput, fast_path_reason
from gn_module.module import GroupNorm

StrategyKind = Literal["replicated", "fsdp", "fsdp2", "deepspeed"]
_SHARDED_KINDS = ("fsdp", "fsdp2")

DEEPSPEED_REFUSAL = (
    "GNSwapCallback does not support DeepSpeedStrategy: DeepSpeed is not installed on the machines this "
    "project is tested on, so the swap has never run under ZeRO. Use FSDPStrategy or ModelParallelStrategy "
    "(FSDP2), which the callback supports, or call gn_module.convert_groupnorm(self) at the end of "
    "LightningModule.configure_model yourself (untested under DeepSpeed)."
)


def strategy_kind(strategy: Strategy) -> StrategyKind:
    """How the callback treats ``strategy``.

    ``"fsdp"``: `FSDPStrategy` (FSDP1, wraps the model in ``strategy.setup``, or earlier when
    ``configure_model`` calls ``wrap``); ``"fsdp2"``: `ModelParallelStrategy` (``configure_model``
    applies ``fully_shard``); ``"deepspeed"``: refused; ``"replicated"``: everything else (single device,
    DDP), where every rank holds whole parameters.
    """
    if isinstance(strategy, DeepSpeedStrategy):
        return "deepspeed"
    if isinstance(strategy, FSDPStrategy):
        return "fsdp"
    if isinstance(strategy, ModelParallelStrategy):
        return "fsdp2"
    return "replicated"


def is_sharded(module: nn.Module) -> bool:
    """True when FSDP (either version) or DTensor already manages some of ``module``'s parameters."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, (FSDPModule, FullyShardedDataParallel)) for m in module.modules()) or any(
        isinstance(p, DTensor) for p in module.parameters()
    )


class LayerCall(NamedTuple):
    """What one swapped layer received in its first call of a stage; ``reason`` is why torch's path
    ran (`gn_module.functional.fast_path_reason`), None when our kernels ran."""

    input_dtype: torch.dtype
    weight_dtype: torch.dtype | None
    device_type: str
    reason: str | None


class GNSwapCallback(Callback):
    """Swap the model's GroupNorm layers for the fast channels-last `gn_module.GroupNorm`.

    Lifecycle, once per ``fit``/``validate``/``test``/``predict``:

    1. ``setup`` (this callback): DeepSpeed is refused; the swap is scheduled.
    2. The LightningModule's ``setup`` and ``configure_model`` run: layers created there are included,
       and under FSDP2 (`ModelParallelStrategy`) ``configure_model`` has already applied ``fully_shard``.
    3. The swap, at the start of ``strategy.setup``: after a checkpoint given as ``ckpt_path`` was loaded
       into the model (strategies that load after setup, FSDP and FSDP2, load into the swapped model;
       state_dict keys are the same), before the strategy materializes meta-device parameters, converts
       the precision, moves and wraps the model (DDP, FSDP1's auto-wrap) and builds the optimizers.
    4. The first batch: every swapped layer records its input dtype, weight dtype and, when torch's
       path ran instead of our kernels, the reason; a rank-zero log names them (``first_calls``), a
       warning when that happened on CUDA. Code run under torch.compile records nothing.
    5. ``teardown``: optionally the original layers come back (``restore_on_teardown``).

    Under DDP and a single device the layers are replaced by new `gn_module.GroupNorm` objects that reuse
    the original Parameters. Under FSDP and FSDP2 (and whenever FSDP or DTensor already manages the
    model) plain ``nn.GroupNorm`` layers are converted in place (``convert_groupnorm(in_place=True)``:
    the class changes, the object stays), because FSDP remembers which module object owns each
    parameter; parameters keep their memory format there (FSDP all-gathers them contiguous), so give the
    model channels_last inputs: convolutions then produce channels_last outputs. Either way state_dict
    keys are unchanged, so full and sharded checkpoints load into the plain model and vice versa with
    ``strict=True``, and `gn_module.revert_groupnorm` undoes the swap after training.

    The callback is stateless: on resume it swaps again; nothing of it is in the checkpoint.

    Args:
        channels_last: convert 4-D/5-D parameters and buffers to channels_last(_3d), so that conv
            outputs (and hence GroupNorm inputs) are channels-last, which the fast kernels need.
            Ignored under FSDP/FSDP2 (see above), and when the trainer's device
            (``trainer.strategy.root_device``) is not CUDA: there torch's GroupNorm runs anyway, and on
            CPU torch's GroupNorm backward crashes on some channels_last inputs (one that needs no
            gradient, after a frozen conv, with a weight that does).
        fuse_acts, fuse_silu, include, exclude, min_channels, fuse_calls, autocast_output: passed to
            `gn_module.convert_groupnorm` (autocast_output="input": bf16/fp16 output under autocast,
            where torch's GroupNorm returns float32).
            ``fuse_acts`` (default `DEFAULT_FUSE_ACTS` and True: SiLU, ReLU, GELU and tanh GELU;
            False: none; or some of "silu", "relu", "gelu", "gelu_tanh")
            picks the activations fused into the GroupNorm before them (timm's GroupNormAct, an
            activation module after it in an nn.Sequential);
            ``fuse_silu=False`` takes SiLU out.
            ``fuse_calls=True`` (opt-in) also fuses GroupNorm -> activation called in sequence inside
            a module's ``forward`` (diffusers' ResNet blocks), by tracing those forwards with torch.fx.
            Use it with torch.compile for such models: Inductor never recomputes our op, so an
            activation called after it keeps the op's output for its backward (more peak memory).
        restore_on_teardown: put the original layers (and memory format) back when the stage ends.
        log_hyperparams: record the counts in every logger's hyperparameters.

    Raises:
        ValueError: ``min_channels`` is not an int >= 0, ``fuse_acts`` names an activation that is
            not fused, or ``fuse_calls=True`` with no activation left to fuse.
        TypeError: ``include`` or ``exclude`` is neither a string nor an iterable of strings (nor
            None); ``fuse_acts`` is neither a bool, a string nor an iterable; ``channels_last``,
            ``fuse_silu``, ``fuse_calls``, ``restore_on_teardown`` or ``log_hyperparams`` is not a bool.
        RuntimeError: in ``setup``, when the strategy is `DeepSpeedStrategy`.

    Example::

        trainer = Trainer(strategy=FSDPStrategy(auto_wrap_policy={ResBlock}), callbacks=[GNSwapCallback()])
    """

    def __init__(
        self,
        *,
        channels_last: bool = True,
        fuse_silu: bool = True,
        include: Patterns = None,
        exclude: Patterns = None,
        min_channels: int = 0,
        fuse_calls: bool = False,
        autocast_output: AutocastOutput = "float32",
        restore_on_teardown: bool = False,
        log_hyperparams: bool = True,
        fuse_acts: FuseActs = DEFAULT_FUSE_ACTS,
    ) -> None:
        super().__init__()
        # Fail at construction, not mid-fit.
        flags = {
            "channels_last": channels_last,
            "fuse_silu": fuse_silu,
            "fuse_calls": fuse_calls,
            "restore_on_teardown": restore_on_teardown,
            "log_hyperparams": log_hyperparams,
        }
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(
                    f"GNSwapCallback(): {name} must be True or False, got {type(value).__name__} {value!r}"
                )
        fuse_acts = materialize_fuse_acts(fuse_acts)  # a tuple: an iterator would be used up
        # As tuples: a generator given as include/exclude would be used up by this check.
        include, exclude = check_options(
            include,
            exclude,
            min_channels,
            owner="GNSwapCallback()",
            fuse_silu=fuse_silu,
            fuse_calls=fuse_calls,
            autocast_output=autocast_output,
            fuse_acts=fuse_acts,
        )
        self.channels_last = channels_last
        self.convert_kwargs: dict[str, Any] = {
            "fuse_silu": fuse_silu,
            "include": include,
            "exclude": exclude,
            "min_channels": min_channels,
            "fuse_calls": fuse_calls,
            "autocast_output": autocast_output,
            "fuse_acts": fuse_acts,
        }
        self.restore_on_teardown = restore_on_teardown
        self.log_hyperparams = log_hyperparams
        self.report: ConversionReport | None = None
        self.first_calls: dict[str, LayerCall] = {}
        self._unpatch: Callable[[], None] | None = None
        self._probes: list[torch.utils.hooks.RemovableHandle] = []
        self._made_channels_last = False

    # -- Lightning hooks ------------------------------------------------------------------------

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Refuse DeepSpeed and schedule the swap for the start of ``strategy.setup``.

        Raises:
            RuntimeError: the strategy is `DeepSpeedStrategy`.
        """
        if strategy_kind(trainer.strategy) == "deepspeed":
            raise RuntimeError(DEEPSPEED_REFUSAL)
        self._defer_swap_to_strategy_setup(trainer)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._finish_probe("on_train_batch_end")

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._finish_probe("on_validation_batch_end")

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._finish_probe("on_test_batch_end")

    @override
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._finish_probe("on_predict_batch_end")

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._remove_patch()
        self._remove_probes()
        if self.restore_on_teardown:
            _, report = revert_groupnorm(pl_module)
            if self._made_channels_last:
                _set_memory_format(pl_module, channels_last=False)
                self._made_channels_last = False
            rank_zero_info(f"GNSwapCallback (teardown): restored {len(report.swapped)} GroupNorm layers")

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_patch()
        self._remove_probes()

    # -- the swap -------------------------------------------------------------------------------

    def _defer_swap_to_strategy_setup(self, trainer: Trainer) -> None:
        # Lightning has no callback hook between `configure_model` and `strategy.setup` (which
        # materializes, converts, wraps the model and creates the optimizers), so the callback runs its
        # swap at the start of this trainer's `strategy.setup` call and removes itself right away.
        # Replacing a bound method on the strategy instance is the one thing here that depends on
        # Lightning's internals: `strategy.setup(trainer)` being called after `configure_model`.
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
        """Convert ``pl_module`` now (in place under FSDP/FSDP2) and arm the first-batch probe.

        Called by the callback at the start of ``strategy.setup``; public for manual use.
        """
        self._remove_probes()  # probe hooks would make convert decline activation fusions
        kind = strategy_kind(trainer.strategy)
        in_place = kind in _SHARDED_KINDS or is_sharded(pl_module)
        _, report = convert_groupnorm(pl_module, in_place=in_place, **self.convert_kwargs)
        # Off CUDA torch's GroupNorm runs, so channels_last gains nothing there, and on CPU torch's
        # GroupNorm backward crashes on channels_last input that needs no gradient (after a frozen conv).
        # The swap runs before the strategy moves the model: judge by the device it will train on, not
        # by where the parameters are now.
        target = target_device_type(trainer)
        off_cuda = target is not None and target != "cuda"
        if self.channels_last and not off_cuda:
            if not in_place:  # every time: layers may have been added since the last stage
                self._made_channels_last |= _set_memory_format(pl_module, channels_last=True)
            elif report.swapped:
                name = type(trainer.strategy).__name__
                rank_zero_info(
                    f"GNSwapCallback: parameters keep their memory format under {name} (FSDP all-gathers "
                    "them contiguous); give the model channels_last inputs so that "
                    "convolutions, and the GroupNorm layers after them, run channels-last"
                )
        if report.swapped or self.report is None:
            self.report = report
            self._log(trainer, report, target if off_cuda else None)
        self._arm_probe(pl_module)
        return report

    def _log(self, trainer: Trainer, report: ConversionReport, off_cuda_target: str | None = None) -> None:
        """``off_cuda_target``: the trainer's device type when it is known and not CUDA."""
        counts = report.summary()
        message = f"GNSwapCallback: {report}"
        if off_cuda_target is not None and report.swapped:
            message += "\n" + off_cuda_note(off_cuda_target, self.channels_last)
        rank_zero_info(message)
        if self.log_hyperparams and trainer.is_global_zero:
            params = {f"gn_swap/{key}": value for key, value in counts.items()}
            params["gn_swap/channels_last"] = self.channels_last
            for logger in trainer.loggers:
                logger.log_hyperparams(params)

    # -- which layers ran our kernels ------------------------------------------------------------

    def _arm_probe(self, pl_module: LightningModule) -> None:
        # A pre-hook sees the layer's input and (under FSDP, already all-gathered and cast by the
        # mixed-precision policy) weight: exactly what `group_norm` will decide on.
        self.first_calls = {}
        for name, module in pl_module.named_modules():
            if isinstance(module, GroupNorm):
                self._probes.append(module.register_forward_pre_hook(self._probe_hook(name)))

    def _probe_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def probe(module: nn.Module, args: tuple[Any, ...]) -> None:
            # Under torch.compile the probe traces to nothing: it must not add graph breaks.
            if torch.compiler.is_compiling() or name in self.first_calls or not args:
                return
            x, weight = args[0], module.weight
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                self.first_calls[name] = LayerCall(
                    x.dtype,
                    None if weight is None else weight.dtype,
                    x.device.type,
                    fast_path_reason(x, weight),
                )

        return probe

    def _remove_probes(self) -> None:
        for handle in self._probes:
            handle.remove()
        self._probes = []

    def _finish_probe(self, hook: str) -> None:
        if not self._probes:
            return
        self._remove_probes()
        message, cuda_fallback = summarize_first_calls(self.first_calls, hook)
        if message and cuda_fallback:
            rank_zero_warn(message)
        elif message:
            rank_zero_info(message)


def target_device_type(trainer: Trainer) -> str | None:
    """The device type the trainer trains on (``trainer.strategy.root_device``), None if unknown."""
    try:
        return trainer.strategy.root_device.type
    except Exception:  # a strategy that cannot tell yet: assume CUDA, the callback's purpose
        return None


def off_cuda_note(target: str, channels_last: bool) -> str:
    """The line added to the swap summary when the trainer's device is not CUDA."""
    note = (
        f"  note: the trainer's device is {target}, where the swapped layers run torch's own GroupNorm "
        "(gn_module's kernels are CUDA-only): same results, no speed-up"
    )
    if channels_last:
        note += "; memory format left as is (channels_last=True applies on CUDA only)"
    return note


def summarize_first_calls(calls: dict[str, LayerCall], hook: str) -> tuple[str, bool]:
    """The log message for the probed layers and whether any fell back to torch's path on CUDA
    (a warning: off CUDA torch's path is expected). An empty message when nothing was probed."""
    if not calls:
        return "", False
    fast = sum(call.reason is None for call in calls.values())
    by_reason: dict[str, list[str]] = {}
    for name, call in calls.items():
        if call.reason is not None:
            by_reason.setdefault(call.reason, []).append(name)
    lines = [f"GNSwapCallback ({hook}): in the first batch {fast} GroupNorm layers ran our kernels"]
    for reason, names in by_reason.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        lines.append(f"  {len(names)} ran torch's path: {reason} ({shown})")
    cuda_fallback = any(call.reason is not None and call.device_type == "cuda" for call in calls.values())
    return "\n".join(lines), cuda_fallback


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
