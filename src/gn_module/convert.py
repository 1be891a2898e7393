"""Swap `nn.GroupNorm` layers of a model for `gn_module.GroupNorm` (and back).

The new layers reuse the original Parameter objects, so optimizers built before or after the swap,
state_dict keys and checkpoints stay valid. Forward/backward/state-dict hooks move with the layer
(the hook dictionaries are shared, so existing hook handles still remove them).

Activation fusion (`FUSABLE_ACTS`: SiLU, ReLU, GELU and GELU with the tanh approximation; the modules
`act_of_module` recognizes) only happens where it is structurally safe:
  * a GroupNorm directly followed by an activation module (`nn.SiLU`, `nn.ReLU`, in place or not,
    `nn.GELU` with ``approximate`` "none" or "tanh", timm's ``GELU``/``GELUTanh``) inside a plain
    `nn.Sequential`: the GroupNorm becomes ``GroupNorm(act=...)`` and the activation's slot becomes an
    `ActSlot` (an `nn.Identity`; `SiLUSlot` for a SiLU), so indices and state_dict keys do not move;
  * timm's ``GroupNormAct`` / ``GroupNorm1Act`` whose ``act`` is one of those modules or
    `nn.Identity`, and whose ``drop`` is `nn.Identity`;
  * opt-in (``fuse_calls=True``): a GroupNorm called in a module's ``forward`` whose output's only use
    is one activation call: an activation module, ``F.silu``, ``F.relu``, ``F.relu_``, ``torch.relu``,
    ``torch.relu_``, ``Tensor.relu``/``relu_`` or ``F.gelu`` (diffusers'
    ``h = self.norm1(h); h = self.nonlinearity(h)``). Each module that owns a GroupNorm has its own
    ``forward`` traced with `torch.fx` (submodules are not traced into); on a match the GroupNorm gets
    the activation as ``act``, the activation call is dropped from the graph and the module gets a
    `fx_fusion.FusedForward` as its instance ``forward``. Module objects, parameters and state_dict keys
    stay as they are; modules that cannot be traced are skipped with the reason.
It is declined when either layer has forward or backward hooks, or the GroupNorm instance also appears
elsewhere. ``fuse_acts`` (and ``fuse_silu``) pick which activations may be fused.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torch import nn

from gn_module.functional import AUTOCAST_OUTPUTS, AutocastOutput
from gn_module.module import GroupNorm

# Subclasses that override forward but compute exactly F.group_norm (by qualified class name, so
# timm need not be installed).
PLAIN_GROUPNORM_CLASSES = frozenset(
    {
        "timm.layers.norm.GroupNorm",
        "timm.layers.norm.GroupNorm1",
        "timm.models.layers.norm.GroupNorm",
        "timm.models.layers.norm.GroupNorm1",
    }
)
# GroupNorm subclasses computing act(drop(group_norm(x))) with `act` and `drop` child modules.
GROUPNORM_ACT_CLASSES = frozenset(
    {
        "timm.layers.norm_act.GroupNormAct",
        "timm.layers.norm_act.GroupNorm1Act",
        "timm.models.layers.norm_act.GroupNormAct",
        "timm.models.layers.norm_act.GroupNorm1Act",
    }
)

# Every per-module hook container nn.Module has in this torch version (forward, backward, state_dict...).
_HOOK_ATTRS = tuple(name for name in vars(nn.Module()) if "hook" in name)
# The converted layer keeps the module it replaced here (a plain attribute, not a submodule, so it
# is invisible to state_dict, parameters() and .to()) so that revert gives back the same object.
_ORIGINAL = "_gn_original"
# Set on layers converted with ``in_place=True`` (class changed, object kept); revert changes it back.
_IN_PLACE = "_gn_in_place"

Patterns = str | Iterable[str] | None


#: The activations convert_groupnorm fuses into a GroupNorm (the `gn_module.functional.ACTS` with a
#: kernel epilogue, "identity" and None aside).
FUSABLE_ACTS = ("silu", "relu", "gelu", "gelu_tanh")
#: ``fuse_acts`` values, what they mean.
FuseActs = bool | str | Iterable[str]
#: What ``fuse_acts`` fuses when left at its default: the activations whose kernel epilogues have
#: passed the GPU suite, all of them since the H200 run of 2026-11-30 (session 7: tests/gpu/test_acts.py,
#: the plugin's and the sweep's rotated-activation cases; a planted GELU-derivative bug went red).
DEFAULT_FUSE_ACTS: tuple[str, ...] = FUSABLE_ACTS

# Stateless activation modules of timm computing F.gelu (qualified names: timm need not be installed).
_TIMM_ACTS = {
    f"{prefix}.activations.{cls}": act
    for prefix in ("timm.layers", "timm.models.layers")
    for cls, act in (("GELU", "gelu"), ("GELUTanh", "gelu_tanh"))
}
# What revert puts back when an ActSlot lost its module (built without one).
_DEFAULT_MODULES: dict[str, Callable[[], nn.Module]] = {
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
}
_GELU_APPROXIMATE = {"none": "gelu", "tanh": "gelu_tanh"}


def act_of_module(module: nn.Module | None) -> str | None:
    """The fused activation (one of `FUSABLE_ACTS`) that ``module`` computes, or None when it is not an
    activation module with a kernel epilogue: exactly `nn.SiLU`, `nn.ReLU` (``inplace`` either way),
    `nn.GELU` (``approximate`` "none" -> "gelu", "tanh" -> "gelu_tanh"), or timm's ``GELU`` /
    ``GELUTanh``; subclasses, modules with state or an instance ``forward`` are not recognized."""
    if module is None or "forward" in vars(module):
        return None
    if module._parameters or module._buffers or module._modules:
        return None
    cls = type(module)
    if cls is nn.SiLU:
        return "silu"
    if cls is nn.ReLU:
        return "relu"
    if cls is nn.GELU:
        return _GELU_APPROXIMATE.get(getattr(module, "approximate", None))
    return _TIMM_ACTS.get(_qualname(module))


class ActSlot(nn.Identity):
    """Placeholder left where an activation module was fused into the preceding GroupNorm (``act``: the
    activation, one of `FUSABLE_ACTS`); revert puts the module back (a new default one of that
    activation when the slot was built without one)."""

    act: str

    def __init__(self, module: nn.Module | None = None, act: str | None = None) -> None:
        super().__init__()
        act = act if act is not None else act_of_module(module)
        if act not in FUSABLE_ACTS:
            raise ValueError(f"ActSlot: act must be one of {FUSABLE_ACTS}, got {act!r} (module {module!r})")
        object.__setattr__(self, _ORIGINAL, module)
        self.act = act
        if module is not None:
            self.train(module.training)

    def original_module(self) -> nn.Module:
        """The activation module this slot replaced (or a new default one of its activation)."""
        module = getattr(self, _ORIGINAL, None)
        return module if module is not None else _DEFAULT_MODULES[self.act]()

    def extra_repr(self) -> str:
        return f"act={self.act!r}"


class SiLUSlot(ActSlot):
    """The `ActSlot` of a fused SiLU (its name from before other activations were fused)."""

    act = "silu"  # a class default too: slots pickled before `act` existed have none of their own

    def __init__(self, silu: nn.Module | None = None) -> None:
        super().__init__(silu, "silu")


def _slot_for(module: nn.Module, act: str) -> ActSlot:
    return SiLUSlot(module) if act == "silu" else ActSlot(module, act)


def materialize_fuse_acts(fuse_acts: FuseActs) -> FuseActs:
    """``fuse_acts`` with an iterable made a tuple, so that it can be read twice (a non-iterable is
    returned as it is, for `resolve_fuse_acts` to reject)."""
    if isinstance(fuse_acts, bool | str):
        return fuse_acts
    try:
        return tuple(fuse_acts)
    except TypeError:
        return fuse_acts


def resolve_fuse_acts(
    fuse_acts: object = DEFAULT_FUSE_ACTS, fuse_silu: object = True, owner: str = "convert_groupnorm()"
) -> frozenset[str]:
    """The activations that may be fused: ``fuse_acts`` True (all of `FUSABLE_ACTS`), False (none), a
    name or an iterable of names, less "silu" when ``fuse_silu`` is False. Raises TypeError/ValueError
    starting with ``owner`` on a bad value."""
    if not isinstance(fuse_silu, bool):
        raise TypeError(
            f"{owner}: fuse_silu must be True or False, got {type(fuse_silu).__name__} {fuse_silu!r}"
        )
    expected = f"True, False, or names among {FUSABLE_ACTS}"
    if isinstance(fuse_acts, bool):
        acts = set(FUSABLE_ACTS) if fuse_acts else set()
    else:
        if isinstance(fuse_acts, str):
            names: tuple[object, ...] = (fuse_acts,)
        else:
            try:
                names = tuple(fuse_acts)  # type: ignore[arg-type]
            except TypeError:
                got = f"{type(fuse_acts).__name__} {fuse_acts!r}"
                raise TypeError(f"{owner}: fuse_acts must be {expected}, got {got}") from None
        bad = [n for n in names if not isinstance(n, str) or n not in FUSABLE_ACTS]
        if bad:
            raise ValueError(f"{owner}: fuse_acts must be {expected}, got {bad[0]!r}")
        acts = set(names)  # type: ignore[arg-type]
    if not fuse_silu:
        acts.discard("silu")
    return frozenset(acts)


@dataclass
class ConversionReport:
    """What `convert_groupnorm` / `revert_groupnorm` did, by qualified module name.

    ``swapped``: layers replaced; ``fused``: GroupNorm layers that now also apply (convert) or no
    longer apply (revert) an activation (a GroupNormAct's own, or the one after them); ``already``:
    layers that needed nothing; ``skipped``: name -> reason for layers left alone and for declined
    fusions (named ``"<norm>+<activation>"``).
    """

    swapped: list[str] = field(default_factory=list)
    fused: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    reverted: bool = False  # made by revert_groupnorm: only changes the wording of str()
    # Modules whose forward now runs (convert) or no longer runs (revert) a traced graph with a
    # GroupNorm+activation fused (``fuse_calls=True``). Not in summary(): its keys stay the same four.
    rewritten: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in ("swapped", "fused", "already", "skipped")}

    def __str__(self) -> str:
        words = {"swapped": "reverted", "fused": "unfused"} if self.reverted else {}
        counts = ", ".join(f"{words.get(k, k)} {v}" for k, v in self.summary().items())
        if self.rewritten:
            counts += f", forwards {'restored' if self.reverted else 'rewritten'} {len(self.rewritten)}"
        lines = [counts] + [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def convert_groupnorm(
    module: nn.Module,
    *,
    fuse_silu: bool = True,
    include: Patterns = None,
    exclude: Patterns = None,
    min_channels: int = 0,
    in_place: bool = False,
    fuse_calls: bool = False,
    autocast_output: AutocastOutput = "float32",
    fuse_acts: FuseActs = DEFAULT_FUSE_ACTS,
) -> tuple[nn.Module, ConversionReport]:
    """Replace GroupNorm layers in ``module`` by `gn_module.GroupNorm`, in place where possible.

    Returns the module (a new object only when ``module`` itself is a GroupNorm) and a report.
    ``include``/``exclude`` are fnmatch patterns on qualified names (as in ``named_modules()``);
    layers with fewer than ``min_channels`` channels are left alone. Converting twice changes nothing.
    ``in_place=True`` changes the class of plain ``nn.GroupNorm`` layers instead of replacing them, so
    the module objects stay (FSDP remembers which module object owns each parameter); other GroupNorm
    classes are then skipped.

    ``fuse_acts`` picks the activations fused into a GroupNorm (module docstring): the default
    `DEFAULT_FUSE_ACTS` (every one of `FUSABLE_ACTS`: "silu", "relu", "gelu", "gelu_tanh"), True the
    same, False none, or some of those names;
    ``fuse_silu=False`` (the option from before the others were fused) takes "silu" out. A timm
    ``GroupNormAct`` whose activation may not be fused is left alone (skipped with the reason).

    ``fuse_calls=True`` (needs an activation to fuse) also fuses a GroupNorm called inside a module's
    ``forward`` whose output is used only by one activation call (an activation module, ``F.silu``,
    ``F.relu``, ``torch.relu``, ``F.gelu``...; module docstring), as in diffusers' ResNet blocks,
    directly or through ``nn.Identity`` calls (timm's ``drop_block``).
    The ``forward`` of each module that owns a GroupNorm is traced with `torch.fx` (its submodules
    are called, not traced into); where a pair is found, that module's ``forward`` becomes a
    `FusedForward` running the edited graph. The graph is specialized as fx
    specializes: Python control flow on attributes is frozen at conversion, except ``self.training``
    (``forward`` is traced in both modes; where the graphs differ the module runs its mode's graph, and
    where they would fuse different GroupNorms it is not rewritten), Python side effects of ``forward`` are
    not replayed, and parameters with defaults keep their defaults. ``forward`` is also traced with
    each tensor parameter after the first passed as None (alone, then all of them), so a VAE block's
    ``temb=None`` call runs fused where that trace fuses the same pairs. Calls that do not fit what was
    traced (another None pattern, a non-tensor where a tensor was traced, a non-default value for a
    parameter with a default, extra ``*args``/``**kwargs``) run the original ``forward`` unfused, with a
    RuntimeWarning once per module class and reason (eager mode).
    Modules whose forward cannot be traced (data-dependent control flow...) are left alone and listed
    in ``skipped``; `revert_groupnorm` restores the original ``forward``.

    ``autocast_output`` goes to every swapped layer: "float32" returns what torch's GroupNorm returns
    under CUDA autocast (float32), "input" the input's dtype (faster; see `gn_module.group_norm`).
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"convert_groupnorm(): expected an nn.Module, got {type(module).__name__}")
    fuse_acts = materialize_fuse_acts(fuse_acts)
    include, exclude = check_options(
        include,
        exclude,
        min_channels,
        fuse_silu=fuse_silu,
        fuse_calls=fuse_calls,
        autocast_output=autocast_output,
        fuse_acts=fuse_acts,
    )
    acts = resolve_fuse_acts(fuse_acts, fuse_silu)
    walker = _Converter(
        module, acts, fuse_silu, include, exclude, min_channels, in_place, fuse_calls, autocast_output
    )
    return walker.visit(module, ""), walker.report


def revert_groupnorm(module: nn.Module) -> tuple[nn.Module, ConversionReport]:
    """Undo `convert_groupnorm`: converted layers become the modules they replaced (sharing the current
    Parameters), an `ActSlot` becomes the activation module it replaced again, and other
    `gn_module.GroupNorm` layers become plain `nn.GroupNorm` (a fused one only when an `ActSlot` of its
    activation follows it)."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"revert_groupnorm(): expected an nn.Module, got {type(module).__name__}")
    walker = _Reverter(module)
    walker.report.reverted = True
    return walker.visit(module, ""), walker.report


# ---------------------------------------------------------------------------------------------
# Classification


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _has_hooks(module: nn.Module) -> bool:
    """Forward/backward hooks, which would see the fused tensors; state_dict hooks (FSDP2 puts a load
    hook on every module owning a parameter) see no activations and do not count."""
    return any(
        getattr(module, attr, None)
        for attr in _HOOK_ATTRS
        if attr != "_is_full_backward_hook" and "state_dict" not in attr
    )


def groupnorm_act(module: nn.GroupNorm) -> tuple[str | None, str | None]:
    """(act, None) when ``module`` computes plain GroupNorm followed by act (None, or for a
    `gn_module.GroupNorm` its ``act``, for a timm GroupNormAct one of `FUSABLE_ACTS`), else (None,
    reason it cannot be represented by `gn_module.GroupNorm`)."""
    name = _qualname(module)
    if "forward" in vars(module):
        return None, "forward is overridden on the instance"
    if isinstance(module, GroupNorm) and type(module).forward is GroupNorm.forward:
        allowed_children: set[str] = set()
        act = module.act
    elif type(module).forward is nn.GroupNorm.forward or name in PLAIN_GROUPNORM_CLASSES:
        allowed_children, act = set(), None
    elif name in GROUPNORM_ACT_CLASSES:
        allowed_children = {"act", "drop"}
        act, reason = _act_of_children(module)
        if reason:
            return None, reason
    else:
        return None, f"{name} overrides forward"
    extra = [f"parameter {k}" for k in module._parameters if k not in ("weight", "bias")]
    extra += [f"buffer {k}" for k in module._buffers]
    extra += [f"submodule {k}" for k in module._modules if k not in allowed_children]
    if extra:
        return None, f"{name} has state a GroupNorm does not have ({', '.join(extra)})"
    return act, None


def _act_of_children(module: nn.Module) -> tuple[str | None, str | None]:
    act, drop = getattr(module, "act", None), getattr(module, "drop", None)
    if type(drop) is not nn.Identity:
        return None, f"has drop={type(drop).__name__}, not nn.Identity"
    if _has_hooks(act) or _has_hooks(drop):
        return None, "its act or drop submodule has hooks"
    if type(act) is nn.Identity and "forward" not in vars(act):
        return None, None
    fused = act_of_module(act)
    if fused is not None:
        return fused, None
    return None, (
        f"act={type(act).__name__} has no fused kernel (fused: SiLU, ReLU, GELU, GELU(approximate='tanh'), "
        "Identity)"
    )


def check_options(
    include: Patterns,
    exclude: Patterns,
    min_channels: int,
    *,
    owner: str = "convert_groupnorm()",
    fuse_silu: bool = True,
    fuse_calls: bool = False,
    autocast_output: object = "float32",
    fuse_acts: object = DEFAULT_FUSE_ACTS,
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """Validate convert_groupnorm's options; returns include/exclude as tuples (or None).
    ``owner`` starts the error messages (the callback passes its own name)."""
    acts = resolve_fuse_acts(fuse_acts, fuse_silu, owner)
    if isinstance(min_channels, bool) or not isinstance(min_channels, int) or min_channels < 0:
        raise ValueError(f"{owner}: min_channels must be an int >= 0, got {min_channels!r}")
    if not isinstance(fuse_calls, bool):
        raise TypeError(
            f"{owner}: fuse_calls must be True or False, got {type(fuse_calls).__name__} {fuse_calls!r}"
        )
    if fuse_calls and not acts:
        why = "fuse_silu=False and fuse_acts leave none" if not fuse_silu else "fuse_acts leaves none"
        raise ValueError(f"{owner}: fuse_calls=True fuses activations, but {why}")
    if not isinstance(autocast_output, str) or autocast_output not in AUTOCAST_OUTPUTS:
        raise ValueError(
            f"{owner}: autocast_output must be one of {AUTOCAST_OUTPUTS}, got {autocast_output!r}"
        )
    return _patterns(include, "include", owner), _patterns(exclude, "exclude", owner)


def _patterns(value: Patterns, what: str, owner: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    expected = "a string (fnmatch pattern), an iterable of strings, or None"
    if isinstance(value, str):
        return (value,)
    try:
        patterns = tuple(value)
    except TypeError:  # not iterable, e.g. include=5
        got = f"{type(value).__name__} {value!r}"
        raise TypeError(f"{owner}: {what} must be {expected}, got {got}") from None
    for item in patterns:
        if not isinstance(item, str):
            got = f"an item of type {type(item).__name__} ({item!r})"
            raise TypeError(f"{owner}: {what} must be {expected}, got {got}")
    return patterns


def _occurrences(root: nn.Module) -> Counter[int]:
    """How many parent slots hold each module (a shared module counts once per slot)."""
    counts: Counter[int] = Counter({id(root): 1})

    def visit(module: nn.Module) -> None:
        for child in module._modules.values():
            if child is not None:
                counts[id(child)] += 1
                if counts[id(child)] == 1:
                    visit(child)

    visit(root)
    return counts


# ---------------------------------------------------------------------------------------------
# Building modules that share Parameters and hooks


def _rehome(new: nn.Module, old: nn.Module) -> nn.Module:
    """Give ``new`` the Parameters, training flag and hooks of ``old``; returns ``new``."""
    for key in ("weight", "bias"):
        new._parameters[key] = old._parameters.get(key)
    for attr in _HOOK_ATTRS:
        setattr(new, attr, getattr(old, attr))
    new.eps = old.eps
    new.train(old.training)
    return new


def _make_groupnorm(old: nn.GroupNorm, cls: type[nn.GroupNorm], **kwargs: object) -> nn.GroupNorm:
    # Built on the meta device so no memory is allocated for parameters that are replaced at once.
    new = cls(old.num_groups, old.num_channels, eps=old.eps, affine=old.affine, device="meta", **kwargs)
    return _rehome(new, old)


class _Walker:
    """Depth-first walk over the module tree that replaces modules and memoizes replacements so that
    a module shared between several parents is converted once and stays shared."""

    def __init__(self, root: nn.Module) -> None:
        self.report = ConversionReport()
        self.counts = _occurrences(root)
        # id -> (module, replacement); holding the module keeps its id from being reused mid-walk.
        self.memo: dict[int, tuple[nn.Module, nn.Module]] = {}

    def visit(self, module: nn.Module, name: str) -> nn.Module:
        if id(module) in self.memo:
            return self.memo[id(module)][1]
        self.before_children(module, name)
        new = self.replace(module, name)
        self.memo[id(module)] = (module, new)
        if new is module:
            for key, child in module._modules.items():
                if child is not None:
                    module._modules[key] = self.visit(child, f"{name}.{key}" if name else key)
            self.after_children(module, name)
        return new

    def before_children(self, module: nn.Module, name: str) -> None:
        pass

    def after_children(self, module: nn.Module, name: str) -> None:
        pass

    def replace(self, module: nn.Module, name: str) -> nn.Module:
        raise NotImplementedError


def _is_plain_sequential(module: nn.Module) -> bool:
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


class _Converter(_Walker):
    def __init__(
        self,
        root: nn.Module,
        acts: frozenset[str],
        fuse_silu: bool,
        include: tuple[str, ...] | None,
        exclude: tuple[str, ...] | None,
        min_channels: int,
        in_place: bool = False,
        fuse_calls: bool = False,
        autocast_output: AutocastOutput = "float32",
    ) -> None:
        super().__init__(root)
        self.autocast_output = autocast_output
        self.acts, self.fuse_silu, self.min_channels, self.in_place = acts, fuse_silu, min_channels, in_place
        self.include, self.exclude, self.fuse_calls = include, exclude, fuse_calls

    def reason_to_skip(self, module: nn.GroupNorm, name: str) -> str | None:
        if self.include is not None and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return f"name matches no include pattern {list(self.include)}"
        for pattern in self.exclude or ():
            if fnmatch.fnmatchcase(name, pattern):
                return f"name matches exclude pattern {pattern!r}"
        if module.num_channels < self.min_channels:
            return f"num_channels={module.num_channels} < min_channels={self.min_channels}"
        return None

    def replace(self, module: nn.Module, name: str) -> nn.Module:
        if isinstance(module, GroupNorm):
            self.report.already.append(name)
            return module
        if not isinstance(module, nn.GroupNorm):
            return module
        act, reason = groupnorm_act(module)
        reason = reason or self.reason_to_skip(module, name)
        if reason is None and act in FUSABLE_ACTS and act not in self.acts:
            reason = self._not_fused_reason(act)
        if reason is None and self.in_place and type(module) is not nn.GroupNorm:
            reason = f"in_place=True converts only plain nn.GroupNorm, not {_qualname(module)}"
        if reason is not None:
            self.report.skipped[name] = reason
            return module
        if self.in_place:
            module.__class__ = GroupNorm  # same attributes plus `act`; nothing else to build
            module.act = act
            if self.autocast_output != GroupNorm.autocast_output:
                module.autocast_output = self.autocast_output
            object.__setattr__(module, _IN_PLACE, True)
            self.report.swapped.append(name)
            return module
        new = _make_groupnorm(module, GroupNorm, act=act, autocast_output=self.autocast_output)
        object.__setattr__(new, _ORIGINAL, module)
        self.counts[id(new)] = self.counts[id(module)]
        self.report.swapped.append(name)
        if act in FUSABLE_ACTS:
            self.report.fused.append(name)
        return new

    def _not_fused_reason(self, act: str) -> str:
        if act == "silu" and not self.fuse_silu:
            return "its activation is SiLU and fuse_silu=False"
        allowed = ", ".join(a for a in FUSABLE_ACTS if a in self.acts) or "none"
        return f"its activation is {act!r}, which fuse_acts excludes (fused: {allowed})"

    def after_children(self, module: nn.Module, name: str) -> None:
        if self.acts and self.fuse_calls:
            from gn_module import fx_fusion  # imports this module

            if fx_fusion.traceable_owner(module):
                fx_fusion.fuse_traced_calls(module, name, self.report, self.counts, acts=self.acts)
        if not self.acts or not _is_plain_sequential(module):
            return
        keys = list(module._modules)
        for key, next_key in itertools.pairwise(keys):
            norm, act_module = module._modules[key], module._modules[next_key]
            act = act_of_module(act_module)
            if not (act in self.acts and isinstance(norm, GroupNorm) and groupnorm_act(norm) == (None, None)):
                continue
            norm_name, act_name = (f"{name}.{k}" if name else k for k in (key, next_key))
            reason = None
            if _has_hooks(norm) or _has_hooks(act_module):
                reason = "the GroupNorm or the activation has hooks that would see a different tensor"
            elif self.counts[id(norm)] > 1:
                reason = "the GroupNorm instance is also used elsewhere, where no activation may follow it"
            if reason is not None:
                self.report.skipped[f"{norm_name}+{act_name}"] = f"not fused: {reason}"
                continue
            # In-place activations fuse too: inside a Sequential nothing else sees the GroupNorm output.
            norm.act = act
            module._modules[next_key] = _slot_for(act_module, act)
            self.report.fused.append(norm_name)


class _Reverter(_Walker):
    def before_children(self, module: nn.Module, name: str) -> None:
        from gn_module import fx_fusion  # imports this module

        fx_fusion.restore_forward(module, name, self.report)
        # Un-fuse GroupNorm(act=a) + ActSlot(a) pairs first; the GroupNorm is then reverted as a
        # plain one when the walk reaches it.
        keys = list(module._modules)
        for key, next_key in itertools.pairwise(keys):
            norm, slot = module._modules[key], module._modules[next_key]
            if isinstance(norm, GroupNorm) and isinstance(slot, ActSlot) and norm.act == slot.act:
                norm.act = None
                module._modules[next_key] = slot.original_module()
                self.report.fused.append(f"{name}.{key}" if name else key)

    def replace(self, module: nn.Module, name: str) -> nn.Module:
        if isinstance(module, ActSlot):
            self.report.skipped[name] = (
                f"{type(module).__name__} (act={module.act!r}) does not follow a GroupNorm fused with it; "
                "left in place"
            )
            return module
        if not isinstance(module, GroupNorm):
            if isinstance(module, nn.GroupNorm):
                self.report.already.append(name)
            return module
        _, reason = groupnorm_act(module)
        if reason is not None:
            self.report.skipped[name] = reason
            return module
        if getattr(module, _IN_PLACE, False):
            if module.act not in (None, "identity"):
                self.report.skipped[name] = _no_slot(module.act)
                return module
            module.__class__ = nn.GroupNorm
            del module.act
            module.__dict__.pop("autocast_output", None)
            object.__delattr__(module, _IN_PLACE)
            self.report.swapped.append(name)
            return module
        original = getattr(module, _ORIGINAL, None)
        if original is not None:
            act, _ = groupnorm_act(original)
            if act != module.act:
                self.report.skipped[name] = f"act changed since conversion ({act!r} -> {module.act!r})"
                return module
            new = _rehome(original, module)
            new.train(module.training)  # also the children of a GroupNormAct
        elif module.act in (None, "identity"):
            new = _make_groupnorm(module, nn.GroupNorm)
        else:
            self.report.skipped[name] = _no_slot(module.act)
            return module
        self.report.swapped.append(name)
        return new


def _no_slot(act: str) -> str:
    return f"fused act={act!r} has no ActSlot after it to move back into"
