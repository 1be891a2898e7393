"""scripts/variance_probe.py without a GPU: its reading of the medians; a clear exit with no CUDA device."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

vp = load_script("variance_probe")


def test_sets_that_repeat_but_differ_follow_the_addresses() -> None:
    medians = [[376.0, 377.0, 376.5], [401.0, 400.0, 401.5], [377.0, 376.0, 377.5]]
    s = vp.spread(medians)
    assert s["between_sets_us"] == pytest.approx(400.8333 - 376.5, abs=1e-3)
    assert s["residual_us"] < 2 and s["between_rounds_us"] < 1
    assert "addresses" in vp.verdict(s)


def test_sets_that_move_together_follow_time() -> None:
    medians = [[376.0, 400.0, 377.0], [376.5, 401.0, 376.0], [377.0, 400.5, 376.5]]
    s = vp.spread(medians)
    assert s["between_rounds_us"] > 20 and s["between_sets_us"] < 1 and s["residual_us"] < 2
    assert "time" in vp.verdict(s)


def test_noise_within_every_set_is_neither() -> None:
    medians = [[376.0, 400.0, 390.0], [400.0, 377.0, 389.0], [389.0, 390.0, 376.0]]
    s = vp.spread(medians)
    assert s["residual_us"] > 20 and "timing to timing" in vp.verdict(s)


def test_unequal_rounds_are_refused() -> None:
    with pytest.raises(ValueError):
        vp.spread([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError):
        vp.spread([[1.0], [2.0]])  # (one round: time and noise cannot be told apart)


def test_bad_arguments_and_no_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        vp.main(["32x128x256x256", "--repeats", "1"])
    if not torch.cuda.is_available():
        assert vp.main(["2x64x8x8"]) == 3
        assert "needs a CUDA GPU" in capsys.readouterr().err
