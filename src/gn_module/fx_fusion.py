"""``convert_groupnorm(..., fuse_calls=True)``: GroupNorm followed by an activation inside a module's
own ``forward`` (diffusers' ResNet blocks call ``self.nonlinearity`` after ``self.norm1``), found with
torch.fx and fused into the GroupNorm; `FusedForward` runs the edited graph in the module's place.

The activation calls recognized (`act_call`): a module `gn_module.convert.act_of_module` recognizes
(``nn.SiLU``, ``nn.ReLU``, ``nn.GELU``...), ``F.silu``, ``F.relu``, ``F.relu_``/``torch.relu_``,
``torch.relu``, ``Tensor.relu``/``relu_`` and ``F.gelu`` with a constant ``approximate``; each applied
to the GroupNorm output alone (in place or not: nothing else reads that output), directly or through
``nn.Identity`` calls in between (timm's ResNet blocks call ``self.drop_block``, an ``nn.Identity``
unless drop-block is on, between ``self.bn2`` and ``self.act2``).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections import Counter
from collections.abc import Iterable

import torch
import torch.fx
from torch import nn

from gn_module.convert import (
    FUSABLE_ACTS,
    ConversionReport,
    _has_hooks,
    _is_plain_sequential,
    act_of_module,
    groupnorm_act,
)
from gn_module.module import GroupNorm

_NAMED = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.KEYWORD_ONLY,
)
_SIMPLE_DEFAULTS = (bool, int, float, str, bytes, type(None))


def _owned(module: nn.Module) -> Iterable[nn.Module]:
    """Submodules ``module``'s forward can call itself: children, and the items of child containers."""
    for child in module._modules.values():
        if child is None:
            continue
        yield child
        if type(child) in (nn.ModuleList, nn.ModuleDict):
            yield from _owned(child)


def traceable_owner(module: nn.Module) -> bool:
    """Worth tracing: a module with its own forward calling (a container holding) a fusable GroupNorm."""
    if isinstance(module, nn.GroupNorm) or _is_plain_sequential(module) or "forward" in vars(module):
        return False  # an instance forward (ours after a first conversion, or the user's) is left alone
    if getattr(type(module), "forward", None) in (None, nn.Module.forward):
        return False  # containers without a forward
    return any(
        isinstance(m, GroupNorm) and m.act is None and groupnorm_act(m) == (None, None)
        for m in _owned(module)
    )


def _type_checked(module: nn.Module) -> list[str]:
    """The type tests (``isinstance``, ``torch.is_tensor``, ...) in ``forward``'s own source. Any
    counts: the value tested is often an alias of an argument (diffusers: ``timesteps = timestep``)."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return []
    return sorted(set(re.findall(r"\b(isinstance|is_tensor|is_floating_point|is_complex)\(", source)))


def _forward_parameters(module: nn.Module) -> list[inspect.Parameter]:
    """Parameters of ``type(module).forward`` after ``self``."""
    return list(inspect.signature(type(module).forward).parameters.values())[1:]


class _CallsTracer(torch.fx.Tracer):
    """Traces only the root's own forward (every submodule is a leaf ``call_module``), with the
    parameters that have no default as proxies (those named in ``none`` passed as None instead),
    defaults left to the forward and ``*args``/``**kwargs`` empty (diffusers' blocks take ``*args,
    **kwargs`` only to warn about deprecated ones)."""

    def __init__(
        self, traced: list[inspect.Parameter] | None = None, none: frozenset[str] = frozenset()
    ) -> None:
        super().__init__()
        self.traced = traced  # None: an ordinary trace (fx re-traces generated code when unpickling)
        self.none = none

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):  # type: ignore[no-untyped-def]
        if self.traced is None:
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        # A function with exactly the traced parameters, calling the real forward (built from
        # identifiers taken from the signature: nothing else goes into the source).
        names = [p.name for p in self.traced if p.name not in self.none]
        values = {p.name: "None" if p.name in self.none else p.name for p in self.traced}
        call = ", ".join(
            values[p.name] if p.kind != p.KEYWORD_ONLY else f"{p.name}={values[p.name]}" for p in self.traced
        )
        source = f"def forward(self, {', '.join(names)}):\n    return __gn_forward(self, {call})\n"
        namespace: dict[str, object] = {"__gn_forward": root_fn}
        exec(compile(source, f"<gn_module fuse_calls {type(self.root).__qualname__}>", "exec"), namespace)
        return super().create_args_for_root(namespace["forward"], is_module, concrete_args)


def _trace(
    module: nn.Module, traced: list[inspect.Parameter], none: frozenset[str] = frozenset()
) -> torch.fx.Graph:
    """Trace ``module.forward`` (the parameters in ``none`` passed as None); attributes the tracer adds
    to ``module`` (tensor constants) are removed again, and a graph that needs them is refused."""
    before = set(vars(module))
    try:
        graph = _CallsTracer(traced, none).trace(module)
    finally:
        added = set(vars(module)) - before
        for key in added:
            delattr(module, key)
    for node in graph.nodes:
        if node.op == "get_attr" and node.target.split(".")[0] in added:
            raise RuntimeError("forward creates tensor constants while it is traced")
    return graph


def _trace_both_modes(
    module: nn.Module, traced: list[inspect.Parameter], none: frozenset[str] = frozenset()
) -> dict[bool, torch.fx.Graph]:
    """The graphs of ``module.forward`` traced in train mode (key True) and in eval mode (False): one
    graph under both keys where they trace alike, else one each (a forward branching on
    ``self.training``, as diffusers' ResnetBlock2D does around its shortcut's ``.contiguous()``; fx
    freezes such a branch, so `FusedForward` picks the graph of the module's mode at each call)."""
    modes = {id(m): (m, m.training) for m in module.modules()}
    graphs: dict[bool, torch.fx.Graph] = {}
    try:
        for mode in (module.training, not module.training):
            module.train(mode)
            graphs[mode] = _trace(module, traced, none)
    finally:
        for m, training in modes.values():
            m.training = training
    if graphs[True].python_code("self").src == graphs[False].python_code("self").src:
        graphs[False] = graphs[True]
    return graphs


# Functions applying an activation to their first argument, with the other arguments they may take
# ("inplace": in place is fine, nothing else reads the GroupNorm output).
_FUNCTIONS: dict[object, tuple[str, str, frozenset[str]]] = {
    nn.functional.silu: ("silu", "F.silu", frozenset({"inplace"})),
    nn.functional.relu: ("relu", "F.relu", frozenset({"inplace"})),
    torch.relu: ("relu", "torch.relu", frozenset()),
    torch.relu_: ("relu", "torch.relu_", frozenset()),  # also F.relu_
}
_METHODS = {"relu": "Tensor.relu", "relu_": "Tensor.relu_"}


def act_call(node: torch.fx.Node, source: torch.fx.Node, owner: nn.Module) -> tuple[str, str] | None:
    """(act, how) when ``node`` applies one of `FUSABLE_ACTS` to exactly ``source``: ``how`` is the
    module's target for an activation module, else the function ("F.silu", "torch.relu", "F.gelu",
    "Tensor.relu"...); None for anything else."""
    first = node.args[:1] == (source,)
    if node.op == "call_module":
        act = act_of_module(owner.get_submodule(node.target))
        return (act, str(node.target)) if act and node.args == (source,) and not node.kwargs else None
    if node.op == "call_method":
        plain = node.target in _METHODS and node.args == (source,) and not node.kwargs
        return ("relu", _METHODS[node.target]) if plain else None
    if node.op != "call_function" or not first:
        return None
    if node.target is nn.functional.gelu:  # gelu(input, *, approximate="none")
        if len(node.args) != 1 or set(node.kwargs) - {"approximate"}:
            return None
        approximate = node.kwargs.get("approximate", "none")
        act = {"none": "gelu", "tanh": "gelu_tanh"}.get(approximate) if isinstance(approximate, str) else None
        return (act, "F.gelu") if act else None
    try:
        act, how, allowed = _FUNCTIONS[node.target]
    except (KeyError, TypeError):  # TypeError: an unhashable target
        return None
    positional_extra = len(node.args) - 1
    if positional_extra > len(allowed) or set(node.kwargs) - allowed:
        return None
    return act, how


def passes_through(node: torch.fx.Node, source: torch.fx.Node, owner: nn.Module) -> bool:
    """Whether ``node`` calls an ``nn.Identity`` (the class itself, without hooks) on exactly ``source``:
    it returns its input, so an activation after it may be fused into the GroupNorm before it."""
    if node.op != "call_module" or node.args != (source,) or node.kwargs:
        return False
    identity = owner.get_submodule(node.target)
    return type(identity) is nn.Identity and not _has_hooks(identity)


def fuse_traced_calls(
    module: nn.Module,
    name: str,
    report: ConversionReport,
    counts: Counter[int],
    acts: Iterable[str] = FUSABLE_ACTS,
) -> None:
    """Fuse GroupNorm -> activation call pairs in ``module``'s own forward (see `convert_groupnorm`);
    ``acts``: the activations that may be fused."""
    acts = frozenset(acts)
    params = _forward_parameters(module)
    traced = [p for p in params if p.kind in _NAMED and p.default is p.empty]
    checked = _type_checked(module)
    if checked:
        # fx traces proxies, not tensors: a type test takes its non-tensor branch for good (diffusers'
        # UNet2DModel.forward converts a non-tensor timestep, and every later call failed)
        report.skipped[name] = (
            f"forward not traced for activation fusion: it tests types ({', '.join(checked)})"
        )
        return
    try:
        graphs = _trace_both_modes(module, traced)
    except Exception as exc:  # tracing runs arbitrary user code
        first_line = (str(exc).strip().splitlines() or [""])[0]
        report.skipped[name] = (
            f"forward not traced for activation fusion ({type(exc).__name__}: {first_line})"
        )
        return
    found = {True: _fusable_pairs(module, graphs[True], name, counts, acts)}
    same = graphs[False] is graphs[True]  # (one graph for both modes: its pairs once)
    found[False] = found[True] if same else _fusable_pairs(module, graphs[False], name, counts, acts)
    (pairs, skipped), (eval_pairs, eval_skipped) = found[True], found[False]
    if [(n.target, act) for n, _, _, act, _ in pairs] != [(n.target, act) for n, _, _, act, _ in eval_pairs]:
        # a GroupNorm's act is one setting for both modes: fused in both, or not at all
        report.skipped[name] = (
            "forward not rewritten for activation fusion: it reads self.training, and its train and "
            "eval graphs fuse different GroupNorms"
        )
        return
    report.skipped.update(skipped)
    report.skipped.update(eval_skipped)
    if not pairs:
        return
    train, evaluate = _edited(module, graphs, found)
    variants = _none_variants(
        module, traced, [(n.target, act) for n, _, _, act, _ in pairs], name, counts, acts
    )
    fused = tuple(str(node.target) for node, *_ in pairs)
    fused_acts = tuple(act for _, _, _, act, _ in pairs)
    # (an instance attribute)
    module.forward = FusedForward(module, train, fused, fused_acts, evaluate, variants)
    for node, _, norm, act, _ in pairs:
        norm.act = act
        report.fused.append(f"{name}.{node.target}" if name else str(node.target))
    report.rewritten.append(name)


_Pair = tuple[torch.fx.Node, torch.fx.Node, GroupNorm, str, torch.fx.Node]


def _fusable_pairs(
    module: nn.Module, graph: torch.fx.Graph, name: str, counts: Counter[int], acts: frozenset[str]
) -> tuple[list[_Pair], dict[str, str]]:
    """The (GroupNorm node, activation node, GroupNorm, act, head) pairs of ``graph`` that may be fused,
    in graph order (head: the node the activation reads, the GroupNorm's or an nn.Identity's after
    it), and the pairs found but not fusable, with the reason, keyed as ConversionReport.skipped."""

    def qualified(target: object) -> str:
        return f"{name}.{target}" if name else str(target)

    calls = Counter(id(module.get_submodule(n.target)) for n in graph.nodes if n.op == "call_module")
    pairs: list[_Pair] = []
    skipped: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        norm = module.get_submodule(node.target)
        if not (isinstance(norm, GroupNorm) and norm.act is None and groupnorm_act(norm) == (None, None)):
            continue
        head = node  # the GroupNorm's output, or the last nn.Identity call it passes through alone
        while len(head.users) == 1 and passes_through(next(iter(head.users)), head, module):
            head = next(iter(head.users))
        found = [(user, call) for user in head.users if (call := act_call(user, head, module)) is not None]
        found = [(user, call) for user, call in found if call[0] in acts]
        if not found:
            continue
        user, (act, how) = found[0]
        act_module = module.get_submodule(user.target) if user.op == "call_module" else None
        reason = None
        if len(head.users) != 1:
            reason = "the GroupNorm output is also used elsewhere in forward"
        elif len(node.args) != 1 or node.kwargs:
            reason = "the GroupNorm is called with more than its input"
        elif calls[id(norm)] > 1 or counts[id(norm)] > 1:
            reason = "the GroupNorm instance is also used elsewhere, where no activation may follow it"
        elif _has_hooks(norm) or (act_module is not None and _has_hooks(act_module)):
            reason = "the GroupNorm or the activation has hooks that would see a different tensor"
        if reason is not None:
            skipped[f"{qualified(node.target)}+{qualified(how) if act_module else how}"] = (
                f"not fused: {reason}"
            )
            continue
        pairs.append((node, user, norm, act, head))
    return pairs, skipped


#: The most calls with None arguments `_none_variants` traces besides the all-tensor one.
MAX_NONE_VARIANTS = 4


def _edited(
    module: nn.Module,
    graphs: dict[bool, torch.fx.Graph],
    found: dict[bool, tuple[list[_Pair], dict[str, str]]],
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The train and eval graphs with each found activation call dropped (its uses read the GroupNorm's
    output, or the nn.Identity after it, instead), as GraphModules: one object where both modes share it."""
    graph_modules: dict[int, torch.fx.GraphModule] = {}  # by id(graph): one where both modes share it
    for mode, graph in graphs.items():
        if id(graph) in graph_modules:
            continue
        for _, user, _, _, head in found[mode][0]:  # (an nn.Identity in between stays)
            user.replace_all_uses_with(head)
            graph.erase_node(user)
        graph.lint()
        graph_modules[id(graph)] = torch.fx.GraphModule(module, graph, class_name=type(module).__name__)
    train, evaluate = (graph_modules[id(graphs[mode])] for mode in (True, False))
    return train, evaluate


def _none_variants(
    module: nn.Module,
    traced: list[inspect.Parameter],
    fused: list[tuple[str, str]],
    name: str,
    counts: Counter[int],
    acts: frozenset[str],
) -> dict[frozenset[str], tuple[torch.fx.GraphModule, torch.fx.GraphModule]]:
    """Graphs for calls that pass None for traced parameters after the first: each alone, then all of
    them (a VAE's ResnetBlock2D is called with ``temb=None``, which the proxy trace cannot cover: there
    ``temb is not None`` held). A variant is kept only where it traces in both modes and fuses exactly
    the pairs ``fused`` (GroupNorm target, act) of the all-tensor trace: a GroupNorm's act is one setting
    for every call. Calls with other None patterns run the class's forward, unfused."""
    rest = [p.name for p in traced[1:]]
    candidates = [frozenset({n}) for n in rest] + ([frozenset(rest)] if len(rest) > 1 else [])
    variants = {}
    for none in candidates[:MAX_NONE_VARIANTS]:
        try:
            graphs = _trace_both_modes(module, traced, none)
        except Exception:  # None reached code that needs a tensor: such calls run the class's forward
            continue
        found = {mode: _fusable_pairs(module, graph, name, counts, acts) for mode, graph in graphs.items()}
        if any([(n.target, act) for n, _, _, act, _ in found[mode][0]] != fused for mode in found):
            continue
        variants[none] = _edited(module, graphs, found)
    return variants


def restore_forward(module: nn.Module, name: str, report: ConversionReport) -> None:
    """Undo `_fuse_traced_calls` on ``module``: unfuse its GroupNorms and drop the instance forward."""
    forward = vars(module).get("forward")
    if not isinstance(forward, FusedForward) or forward.module is not module:
        return
    for target, act in zip(forward.fused, forward.acts, strict=True):
        norm = module.get_submodule(target)
        if isinstance(norm, GroupNorm) and norm.act == act:
            norm.act = None
            report.fused.append(f"{name}.{target}" if name else target)
    del module.forward
    report.rewritten.append(name)


def _same_default(value: object, default: object) -> bool:
    if value is default:
        return True
    return type(value) is type(default) and type(default) in _SIMPLE_DEFAULTS and value == default


class FusedForward:
    """The instance ``forward`` that ``convert_groupnorm(fuse_calls=True)`` gives a module: the module's
    traced forward with activation calls fused into the GroupNorm before them (``fused``: their
    targets; ``acts``: the activation each one got).

    Runs the graph (``.code`` shows it) with the module as ``self``, so it always uses the module's
    current submodules and parameters: ``graph_module`` (traced in train mode), or ``eval_graph_module``
    while the module is in eval mode where its forward traced differently there (it reads
    ``self.training``; None: the same graph). A call passing None for traced parameters runs the graphs
    traced with those None (``none_variants``, by the set of parameter names), where there are any. A call
    the traces do not cover runs the class's forward with the fused GroupNorms set back to ``act=None`` for
    that call.
    """

    def __init__(
        self,
        module: nn.Module,
        graph_module: torch.fx.GraphModule,
        fused: tuple[str, ...],
        acts: tuple[str, ...] | None = None,
        eval_graph_module: torch.fx.GraphModule | None = None,
        none_variants: dict[frozenset[str], tuple[torch.fx.GraphModule, torch.fx.GraphModule | None]]
        | None = None,
    ) -> None:
        self.module, self.graph_module, self.fused = module, graph_module, fused
        self.eval_graph_module = None if eval_graph_module is graph_module else eval_graph_module
        self.none_variants = {
            none: (train, None if evaluate is train else evaluate)
            for none, (train, evaluate) in (none_variants or {}).items()
        }
        self.acts = ("silu",) * len(fused) if acts is None else acts
        if len(self.acts) != len(fused):
            raise ValueError(f"FusedForward: {len(fused)} fused GroupNorms but {len(self.acts)} acts")

    def _graph(self, none: frozenset[str] = frozenset()) -> torch.fx.GraphModule:
        """The graph of the module's mode now, for a call passing None for the parameters ``none``."""
        train, evaluate = (
            (self.graph_module, self.eval_graph_module) if not none else self.none_variants[none]
        )
        if evaluate is None or self.module.training:
            return train
        return evaluate

    @property
    def code(self) -> str:
        return self._graph().code

    def __getstate__(self) -> dict[str, object]:
        # Pickle and deepcopy: keep the module, graphs, targets and acts; the rest is rebuilt on first call.
        keys = ("module", "graph_module", "eval_graph_module", "fused", "acts", "none_variants")
        return {k: self.__dict__[k] for k in keys}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        if "acts" not in state:  # pickled when SiLU was the only activation fused
            self.acts = ("silu",) * len(self.fused)
        if "eval_graph_module" not in state:  # pickled when one graph served both modes
            self.eval_graph_module = None
        if "none_variants" not in state:  # pickled before calls with None arguments had graphs
            self.none_variants = {}

    def _fused_args(
        self, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[list[object], frozenset[str]] | str | None:
        """The graph arguments and the parameters passed as None when a trace covers this call; else why
        not (a string), or None where the arguments do not bind (the class's forward raises the error)."""
        if "_params" not in self.__dict__:
            self._params = _forward_parameters(self.module)
            self._signature = inspect.Signature(self._params)
        try:
            bound = self._signature.bind(*args, **kwargs).arguments
        except TypeError:
            return None
        values, none = [], set()
        for p in self._params:
            if p.name not in bound:
                continue
            value = bound[p.name]
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                return f"extra arguments ({p.name} was traced empty)"
            if p.default is p.empty:
                if value is None:
                    none.add(p.name)  # covered where a variant was traced with it None
                elif not isinstance(value, torch.Tensor):
                    # a proxy stood for it: `is None` / isinstance tests went the tensor way
                    return f"{p.name} is a {type(value).__name__}, traced as a tensor"
                else:
                    values.append(value)
            elif not _same_default(value, p.default):
                return f"{p.name} is not its default, {p.default!r}, which was traced"
        none = frozenset(none)
        if none and none not in self.none_variants:
            return f"{', '.join(sorted(none))} None, a call no kept trace covers"
        return values, none

    def __call__(self, *args: object, **kwargs: object) -> object:
        found = self._fused_args(args, kwargs)
        if isinstance(found, tuple):
            values, none = found
            return type(self._graph(none)).forward(self.module, *values)
        if isinstance(found, str):
            _warn_unfused(self.module, found)
        norms = [self.module.get_submodule(target) for target in self.fused]
        for norm in norms:
            norm.act = None
        try:
            return type(self.module).forward(self.module, *args, **kwargs)
        finally:
            for norm, act in zip(norms, self.acts, strict=True):
                norm.act = act


#: (class, reason) pairs already warned about: one warning each per process.
_WARNED: set[tuple[str, str]] = set()


def _warn_unfused(module: nn.Module, reason: str) -> None:
    """Say once per module class and reason that a call ran the class's forward unfused: the conversion
    report counted its GroupNorms fused, and only the calls its traces cover run them so. Not while
    torch.compile traces (a warning there breaks the graph, and fullgraph=True fails)."""
    if torch.compiler.is_compiling():
        return
    key = (type(module).__qualname__, reason)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"gn_module fuse_calls: a {key[0]}.forward call ran unfused ({reason}); its fused GroupNorms run "
        "with their activation only in the calls that convert_groupnorm(fuse_calls=True) traced",
        RuntimeWarning,
        stacklevel=5,  # (the caller of the module: nn.Module's __call__ and _call_impl are in between)
    )
