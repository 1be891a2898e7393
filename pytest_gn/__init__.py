"""pytest-gn: a pytest plugin that validates GroupNorm implementations on the GPU at hand and,
through the arch sweep, on GPU profiles you do not own. The plugin lives in `pytest_gn.plugin`.

Importing this package imports neither torch nor CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

__all__ = ["impl_under_test"]


def impl_under_test(config: pytest.Config) -> tuple[str, Callable[..., Any]] | None:
    """The GroupNorm implementation this session validates, for other plugins and conftests.

    Returns ``(spec, fn)``: the ``--gn-impl`` (or ini ``gn_impl``) string as given, e.g.
    ``"mypkg.norm:group_norm"``, and the callable it names, imported once at configure time
    (a bad spec already ended the session with a usage error). Returns None when the
    implementation under test is gn_module's own (no ``--gn-impl``, or one naming
    ``gn_module.group_norm``) or when the pytest-gn plugin is not active (``-p no:gn``).

    Safe to call from a conftest's ``pytest_configure`` or any later hook: pytest-gn configures
    first. Importing ``pytest_gn`` imports no torch; the callable's own module may.

    Example (a conftest that times the implementation under test next to ours)::

        import pytest_gn

        def pytest_collection_modifyitems(config, items):
            found = pytest_gn.impl_under_test(config)
            if found is not None:
                spec, fn = found
                ...
    """
    from pytest_gn.plugin import STATE, _resolve_impl

    if not config.pluginmanager.hasplugin("gn"):
        return None
    state = config.stash.get(STATE, None)
    if state is None:  # called before pytest-gn's pytest_configure: resolve it the same way
        from pytest_gn import options

        opts = options.read_options(config)
        fn = _resolve_impl(opts)
        return None if fn is None else (opts.impl, fn)
    if state.impl is None:
        return None
    return state.opts.impl, state.impl
