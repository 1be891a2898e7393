import pytest
from gpu_memory_lock import gpu_memory_turn


@pytest.fixture(autouse=True)
def _gpu_memory_turn(request: pytest.FixtureRequest):
    """Every GPU test shares the device's memory; a `gpu_memory_hog` has it alone (gpu_memory_lock)."""
    with gpu_memory_turn(exclusive=request.node.get_closest_marker("gpu_memory_hog") is not None):
        yield
