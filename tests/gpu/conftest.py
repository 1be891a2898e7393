import pytest
import torch
from gpu_memory_lock import gpu_memory_turn

# A worker keeps at most this much cached device memory past a test (a hog keeps none): beside a 50 GB hog
# on an 80 GB GPU, seven idle workers then hold at most 14 GiB (gpu_memory_lock's docstring).
KEEP_CACHED_BYTES = 2 * 2**30


def _release_cached_memory(hog: bool) -> None:
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    if hog or torch.cuda.memory_reserved() > KEEP_CACHED_BYTES:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _gpu_memory_turn(request: pytest.FixtureRequest):
    """Every GPU test shares the device's memory; a `gpu_memory_hog` has it alone (gpu_memory_lock), and the
    memory a test's worker caches goes back to the driver before its turn ends."""
    hog = request.node.get_closest_marker("gpu_memory_hog") is not None
    with gpu_memory_turn(exclusive=hog, release=lambda: _release_cached_memory(hog)):
        yield
