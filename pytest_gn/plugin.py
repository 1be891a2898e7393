"""pytest-gn: device-aware GroupNorm fixtures, ``@pytest.mark.overflow_grid`` and ``--gn-arch-sweep``.

Loaded through the ``pytest11`` entry point. Importing this module imports neither torch nor
the CUDA extension: everything that needs them happens inside hooks and fixtures, on demand.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gn_module.schedule import DeviceLimits
from pytest_gn import options
from pytest_gn.cases import CaseSpec, GnCase, specs_from_marker
from pytest_gn.report import Tally

SUITE_DIR = Path(__file__).resolve().parent / "suite"
ENV_CAP = "GN_MAX_RESIDENT_BLOCKS"
MARKERS = (
    "overflow_grid(dtypes=('fp16','bf16','fp32'), acts=('fused', None), directions=('fwd','bwd'), "
    "shapes=[(128, 16), (100, 20), (30, 10), (64, 1), (32, 32)], geometries=('even','partial','batch'), "
    "ratios=('x1','x1p1','x2p1','x4p3'), variants=('capped','natural'), cap=3, rotate=True, over_2_31=False,"
    " task_caps=(1, 2, 3)): parametrize the test (through the gn_case fixture) with GroupNorm cases whose "
    "one-pass grid overflows the residency of this GPU (natural), of a residency cap (capped, cheap) and, "
    "with --gn-arch-sweep, of every GPU profile. Ratios: tiles = m x residency + k ('x2p1' = 2R+1). acts: "
    "None/'none', 'identity', 'silu', 'relu', 'gelu', 'gelu_tanh', or 'fused': one cell whose activation "
    "rotates over the fused ones not listed (silu, relu, gelu, gelu_tanh; silu only for --gn-impl) over "
    "cells and scopes. rotate: each (direction, ratio, dtype, act) cell runs once per scope with one (shape,"
    " geometry) kind, rotated over cells and scopes; rotate=False crosses every kind with every cell. "
    "over_2_31: one more case per direction over 2**31 elements (this GPU only). With --gn-arch tasks or "
    "both, also the task kernels' cases: forward ('fwd-tasks-...', GN_ARCH=tasks), the busiest block of a "
    "task reducing m x slots + k chunks, slots being the chunks it keeps in shared memory; backward ('bwd-"
    "tasks-...', GN_ARCH=tasks+bwd), each task having m x team size + k tiles; one-launch backward ('bwd-"
    "tasks1-...', GN_ARCH=tasks+bwd1), as the forward's with chunk pairs; their capped cases rotate over "
    "task_caps.",
    "gn_cuda: the test needs a usable CUDA device; skipped with the reason when there is none.",
)


@dataclass
class GnState:
    opts: options.GnOptions
    profiles: list[DeviceLimits]
    selected: list[DeviceLimits]
    impl: Callable[..., Any] | None = None  # the resolved --gn-impl callable (None: gn_module's own)
    tally: Tally = field(default_factory=Tally)
    _sweep: Any = None
    _device: Any = None
    _device_reason: str | None = None
    _device_probed: bool = False

    @property
    def sweep(self) -> Any:
        if self._sweep is None:
            from pytest_gn.sweep import Sweep

            self._sweep = Sweep(self.selected)
        return self._sweep

    def device(self, with_residency: bool = True) -> tuple[Any, str | None]:
        """(GnDevice, None) or (None, why there is no usable CUDA device). Probed once."""
        if not self._device_probed:
            self._device_probed = True
            from pytest_gn import device as dev

            self._device_reason = dev.cuda_unavailable_reason()
            if self._device_reason is None:
                dev.select_worker_gpu()
                self._device = dev.local_device(with_residency=False)
        if (
            with_residency
            and self._device is not None
            and not self._device.residency
            and not self._device.error
        ):
            from pytest_gn import device as dev

            dev.fill_residency(self._device)
        return self._device, self._device_reason

    def set_device(self, device: Any, reason: str | None = None) -> None:
        """Use `device` (a `pytest_gn.device.GnDevice`) instead of probing CUDA: the plugin's own
        CPU tests put a device with index "cpu" here to run foreign cases on the CPU."""
        self._device, self._device_reason, self._device_probed = device, reason, True


STATE = pytest.StashKey[GnState]()


class _Recorder:
    """Tallies overflow cases and self-checks from test reports (works on the xdist controller too)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = dict(report.user_properties)
        if report.when != "call" and report.outcome == "passed":
            return
        if "gn_selfcheck" in props:
            self.tally.add_selfcheck(report.nodeid, report.outcome)
        case = props.get("gn_case") or props.get("gn_spec")
        if case is None:
            return
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        self.tally.add(case, report.outcome, reason)
        if "gn_memory" in props:
            self.tally.memory[case["id"]] = props["gn_memory"]


def _state(config: pytest.Config) -> GnState:
    return config.stash[STATE]


# ---------------------------------------------------------------- hooks
def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gn import hooks

    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def _load_profiles(config: pytest.Config, opts: options.GnOptions) -> list[DeviceLimits]:
    from gn_module import profiles

    extra: list[DeviceLimits] = []
    try:
        if opts.profiles_file:
            path = Path(opts.profiles_file)
            if not path.is_absolute():
                path = (config.inipath.parent if config.inipath else config.rootpath) / path
            extra += profiles.load_profiles_file(path)
        for result in config.hook.pytest_gn_add_profiles(config=config):
            if result is not None:
                extra += profiles.profiles_from_data(result)
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        raise pytest.UsageError(f"gn profiles: {exc}") from None
    return profiles.merge_profiles(profiles.BUILTIN_PROFILES, extra)


def _resolve_impl(opts: options.GnOptions) -> Callable[..., Any] | None:
    """The --gn-impl callable, imported now so that a bad one is a usage error, not a green run."""
    if not opts.foreign:
        return None
    from pytest_gn.runner import ImplError, load_impl

    try:
        return load_impl(opts.impl)
    except ImplError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(tryfirst=True)  # before conftests' pytest_configure, which may ask impl_under_test
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    opts = options.read_options(config)
    all_profiles = _load_profiles(config, opts)
    from gn_module.profiles import select_profiles

    try:
        selected = select_profiles(opts.profiles, all_profiles)
    except KeyError as exc:
        raise pytest.UsageError(f"--gn-profiles: {exc.args[0]}") from None
    state = GnState(opts, all_profiles, selected, impl=_resolve_impl(opts))
    config.stash[STATE] = state
    config.pluginmanager.register(_Recorder(state.tally), "gn-recorder")
    if opts.max_resident is not None:
        os.environ[ENV_CAP] = str(opts.max_resident)  # also reaches child processes
    # xdist workers configure again with the controller's command line, so they decide alike.
    if opts.impl_on_command_line and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args[:] = [str(SUITE_DIR)]  # `pytest --gn-impl m:f`: the bundled suite, for that impl
    elif opts.arch_sweep:
        have = {str(Path(a).resolve()) for a in config.args}
        if str(SUITE_DIR) not in have:
            config.args.append(str(SUITE_DIR))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("overflow_grid")
    if marker is None:
        return
    name = metafunc.definition.nodeid
    if marker.args:
        raise pytest.UsageError(f"{name}: overflow_grid takes keyword arguments only, got {marker.args!r}")
    if "gn_case" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{name}: a test marked overflow_grid must take the gn_case fixture")
    state = _state(metafunc.config)
    profiles = tuple(p.name for p in state.selected) if state.opts.arch_sweep else ()
    numbers = {p.name: i for i, p in enumerate(state.profiles)}  # stable whatever --gn-profiles picks
    try:
        specs = specs_from_marker(dict(marker.kwargs), profiles=profiles, foreign=state.opts.foreign,
                                  default_shapes=state.opts.shapes, profile_numbers=numbers,
                                  archs=state.opts.archs)  # fmt: skip
    except ValueError as exc:
        raise pytest.UsageError(f"{name}: {exc}") from None
    metafunc.parametrize("gn_case", specs, ids=[s.id for s in specs], indirect=True)


#: Suite modules that check gn_module's own kernels (per-arch compile, model vs occupancy API).
OWN_KERNEL_MODULES = ("test_gn_static.py", "test_gn_selfcheck.py", "test_gn_tasks.py")
#: The suite's module for the task architecture, collected only with --gn-arch tasks, wide, both or all.
TASKS_MODULE = "test_gn_tasks.py"
#: Suite tests that compare the schedule model with the CUDA occupancy API (the summary's self-check).
SELFCHECK_TESTS = ("test_gn_model_matches_occupancy_api", "test_gn_task_model_matches_occupancy_api")


def _in_suite(item: pytest.Item) -> bool:
    return SUITE_DIR in Path(str(item.path)).resolve().parents


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The suite's task module only with --gn-arch tasks, wide, both or all."""
    ours = collection_path.name == TASKS_MODULE and collection_path.parent.resolve() == SUITE_DIR
    archs = _state(config).opts.archs
    return True if ours and "tasks" not in archs and "wide" not in archs else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    opts = _state(config).opts
    keep, drop = [], []
    for item in items:
        if opts.arch_sweep:  # the sweep runs the bundled suite plus the user's overflow_grid tests only
            wanted = _in_suite(item) or item.get_closest_marker("overflow_grid") is not None
        else:  # a foreign implementation's suite is its overflow cases; the rest is about gn_module
            wanted = not (
                opts.foreign and _in_suite(item) and Path(str(item.path)).name in OWN_KERNEL_MODULES
            )
        (keep if wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    _warn_if_profiles_unused(config, items)


def _warn_if_profiles_unused(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--gn-profiles picks the profiles of the arch sweep and of the bundled suite's static tests
    (which also run without the sweep, e.g. under --gn-impl); say so when neither is in the session.
    Only for the command-line option: an ini key may well be set for occasional sweeps."""
    given = config.getoption("gn_profiles", default=None)
    if not given or _state(config).opts.arch_sweep:
        return
    if any("gn_profile" in getattr(getattr(item, "callspec", None), "params", {}) for item in items):
        return
    warnings.warn(
        pytest.PytestConfigWarning(
            f"--gn-profiles {given} has no effect: it picks the GPU profiles of --gn-arch-sweep (and of "
            "the bundled suite's static tests), and neither runs in this session; add --gn-arch-sweep"
        ),
        stacklevel=2,
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    spec = getattr(getattr(item, "callspec", None), "params", {}).get("gn_case")
    if isinstance(spec, CaseSpec):  # known before any skip, so the summary counts skipped cases
        item.user_properties.append(("gn_spec", spec.labels()))
    if _in_suite(item) and getattr(item, "originalname", item.name) in SELFCHECK_TESTS:
        item.user_properties.append(("gn_selfcheck", True))
    if item.get_closest_marker("gn_cuda") or item.get_closest_marker("overflow_grid"):
        _, reason = _state(item.config).device(with_residency=False)
        if reason:
            pytest.skip(f"no usable CUDA device: {reason}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    from pytest_gn.report import header_lines

    state = _state(config)
    opts = state.opts
    try:
        device, reason = state.device()
    except Exception as exc:  # never let the header break a session
        device, reason = None, f"{type(exc).__name__}: {exc}"
    return header_lines(opts.impl, opts.seed, opts.max_resident, device, reason, state.selected,
                        opts.arch_sweep, opts.shapes, opts.archs)  # fmt: skip


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from pytest_gn.summary import summary_lines

    if config.option.collectonly:
        return  # nothing ran; the sweep matrix would only cost compile time
    state = _state(config)
    lines = summary_lines(state)
    if lines:
        terminalreporter.write_sep("=", "gn summary")
        for line in lines:
            terminalreporter.write_line(line)


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def gn_device(pytestconfig: pytest.Config) -> Any:
    """The local CUDA device (`pytest_gn.device.GnDevice`): ``name``, ``cc``, ``sm_count``,
    ``limits`` (per-SM limits as a `DeviceLimits`), ``build`` and ``residency``: the real
    co-resident block count of each one-pass kernel configuration (e.g.
    ``fwd_onepass[fp16,vec8]``) from the CUDA occupancy API. Skips without a usable GPU; under
    pytest-xdist each worker is put on its own GPU (gw0 -> cuda:0, gw1 -> cuda:1, ...)."""
    device, reason = _state(pytestconfig).device()
    if device is None:
        pytest.skip(f"no usable CUDA device: {reason}")
    return device


@pytest.fixture(scope="session")
def gn_impl(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """The GroupNorm under test: ``gn_module.group_norm`` unless ``--gn-impl module:callable``.

    Protocol: ``impl(x, num_groups, weight, bias, eps, act) -> y``, differentiable in x, weight
    and bias; ``act`` is None or "silu" in the bundled suite (a marker of your own may ask for "relu",
    "gelu", "gelu_tanh" or "identity" too); raise NotImplementedError for what it does not support.
    The bundled suite runs a foreign implementation in a child process, so an abort becomes a
    failed case with its stderr."""
    state = _state(pytestconfig)
    if state.impl is not None:
        return state.impl
    import gn_module

    return gn_module.group_norm


@pytest.fixture
def gn_case(request: pytest.FixtureRequest) -> Iterator[GnCase]:
    """The overflow case of a test marked ``overflow_grid`` (a `pytest_gn.cases.GnCase`):
    ``shape`` (N, C, H, W; use channels_last), ``num_groups``, ``dtype``, ``act``,
    ``direction``, ``tiles``, ``residency``, ``expected_grid``, ``overflow_tiles`` (a task
    architecture case, ``--gn-arch tasks``, also ``task``: the slots and residency its launch
    holds, the busiest member's chunks and tiles and its team's size). While the test runs, the
    case's residency cap (and, in the arch sweep, the PTX build of the profile's arch) is in force,
    and for gn_module's own cases its architecture (GN_ARCH=tasks for a forward task case, tasks+bwd
    for a backward one, tiles otherwise). Skips when the case does not
    fit in the device's free memory (``bytes_needed()``), when its geometry has no shape, or when
    the implementation's description says the shape is not supported."""
    spec = getattr(request, "param", None)
    if not isinstance(spec, CaseSpec):
        pytest.fail("gn_case is provided by @pytest.mark.overflow_grid", pytrace=False)
    state = _state(request.config)
    device = request.getfixturevalue("gn_device")
    from pytest_gn import resolve_local
    from pytest_gn.runner import case_context

    case = resolve_local.resolve_for_device(spec, state, device, request.config)
    request.node.user_properties.append(("gn_case", case.summary()))
    _ensure_memory(case, case.bytes_needed(state.opts.foreign), device)
    try:
        with case_context(case, own=not state.opts.foreign):
            yield case
    finally:
        if spec.big:  # give tens of GiB back at once: other xdist workers share the GPU
            from pytest_gn.device import release_memory

            release_memory(device)


def _ensure_memory(case: GnCase, need: int, device: Any) -> None:
    from pytest_gn.device import free_memory, release_memory

    gib = 2**30
    if need > device.total_memory:
        pytest.skip(
            f"{case.id} needs ~{need / gib:.1f} GiB, {device.name} has {device.total_memory / gib:.1f} GiB"
        )
    # 10% headroom: allocator rounding and fragmentation, and what torch and the context add.
    if need > 0.9 * free_memory(device):
        release_memory(device)
        free = free_memory(device)
        if need > 0.9 * free:
            pytest.skip(f"{case.id} needs ~{need / gib:.1f} GiB, only {free / gib:.1f} GiB free on "
                        f"{device.name} ({device.total_memory / gib:.1f} GiB in all; other processes "
                        "or xdist workers hold the rest)")  # fmt: skip


@pytest.fixture(scope="session")
def gn_reference() -> Callable[..., Any]:
    """fp64 reference: ``gn_reference(x, num_groups, weight, bias, eps, act, dy=None)`` returns
    ``.y`` and, when ``dy`` is given, ``.dx``, ``.dweight``, ``.dbias`` (GroupNorm, then the
    activation: None/"identity", "silu", "relu", "gelu" or "gelu_tanh"), all float64."""
    from pytest_gn.reference import reference

    return reference


@pytest.fixture(scope="session")
def gn_assert_close() -> Callable[..., None]:
    """``gn_assert_close(actual, expected, dtype=None, name="output", terms=1)``: elementwise
    ``|a - e| <= atol + rtol * |e|`` with (rtol, atol) by result dtype: fp16 (1e-2, 1e-2), bf16
    (2e-2, 3e-2), fp32 (1e-4, 1e-4) (gn_module.reference.TOLERANCES); ``terms`` (values summed
    per element, e.g. N*H*W for dweight/dbias) scales atol by its square root. Lists of tensors
    are compared pairwise."""
    from pytest_gn.reference import assert_close

    return assert_close


@pytest.fixture(scope="session")
def gn_cap() -> Callable[[int], Any]:
    """``with gn_cap(k): ...`` caps every one-pass launch of gn_module at k co-resident blocks
    (emulating a smaller GPU) inside the block."""
    from gn_module import ops

    return ops.max_resident_blocks


@pytest.fixture
def gn_check(request: pytest.FixtureRequest, gn_device: Any) -> Callable[[GnCase], None]:
    """``gn_check(gn_case)`` runs the case with the implementation under test against the fp64
    reference: a ``fwd`` case the forward only, a ``bwd`` case forward and backward, checking
    the gradients (for gn_module also the launched grid and one-pass == two-pass bitwise).
    Foreign implementations run in a child process. Fails the test with every problem found;
    skips it with the implementation's message when it raises NotImplementedError."""
    from pytest_gn import runner

    state = _state(request.config)
    opts = state.opts

    def check(case: GnCase) -> None:
        if opts.foreign:
            result = runner.check_case_in_child(case, opts.impl, opts.seed, gn_device.index)
        else:
            result = runner.check_case(case, None, opts.seed)
        if result.peak_bytes is not None:
            estimate = case.bytes_needed(opts.foreign)
            request.node.user_properties.append(
                ("gn_memory", {"peak": result.peak_bytes, "estimate": estimate})
            )
        if result.skipped:
            pytest.skip(f"not supported by {opts.impl}: {result.skipped}")
        if not result.ok:
            pytest.fail(result.message(case), pytrace=False)

    return check


@pytest.fixture(scope="session")
def gn_sweep(pytestconfig: pytest.Config) -> Any:
    """The arch sweep's static results (`pytest_gn.sweep.Sweep`) for the selected profiles."""
    return _state(pytestconfig).sweep
