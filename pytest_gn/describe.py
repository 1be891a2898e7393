"""How an implementation under test describes itself, so that its overflow cases fit its tiles.

The protocol (README, "Describing your implementation"): a conftest hook
`pytest_gn_describe_impl` or, failing that, an attribute ``gn_describe`` on the callable, each
answering for one input shape with ``{"tile_rows": R, "resident_blocks": B}`` (a mapping or an
object with those attributes), None (no answer: conservative sizing) or NotImplementedError
(the shape is not supported: the case is skipped with the message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

KEYS = ("tile_rows", "resident_blocks")


class DescriptionError(ValueError):
    """The description is malformed (missing keys, values that are not integers >= 1)."""


def _value(answer: Any, key: str) -> Any:
    if isinstance(answer, dict):
        return answer.get(key)
    return getattr(answer, key, None)


def parse(answer: Any, where: str) -> tuple[int, int] | None:
    """(tile_rows, resident_blocks) from one answer, None for None; DescriptionError otherwise."""
    if answer is None:
        return None
    values = []
    for key in KEYS:
        v = _value(answer, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DescriptionError(
                f"{where} must give {KEYS[0]} and {KEYS[1]} as integers >= 1, got {key}={v!r} in {answer!r}"
            )
        values.append(v)
    return values[0], values[1]


def describer(
    config: pytest.Config, impl: Callable[..., Any], num_groups: int, dtype: Any, direction: str, device: Any
) -> Callable[[tuple[int, ...]], tuple[int, int] | None] | None:
    """``describe(shape) -> (tile_rows, resident_blocks) | None`` for the implementation, or
    None when neither a conftest hook nor a ``gn_describe`` attribute can answer."""
    own = getattr(impl, "gn_describe", None)
    hook = config.hook.pytest_gn_describe_impl
    if own is None and not hook.get_hookimpls():
        return None

    def describe(shape: tuple[int, ...]) -> tuple[int, int] | None:
        kwargs = {"shape": tuple(shape), "num_groups": num_groups, "dtype": dtype, "direction": direction,
                  "device": device}  # fmt: skip
        answer = hook(config=config, impl=impl, **kwargs)
        if answer is not None:
            return parse(answer, "pytest_gn_describe_impl")
        if own is not None:
            return parse(own(**kwargs), f"{getattr(impl, '__name__', 'impl')}.gn_describe")
        return None

    return describe
