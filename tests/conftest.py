import shutil

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu_memory_hog: takes most of the GPU's memory, so runs alone (tests/gpu_memory_lock.py)"
    )


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory):
    """gn_module's C++ extension (the autograd node and the ops' C++ kernels), built into a fresh cache;
    skips where it cannot be built (no C++ compiler or ninja)."""
    from gn_module import autograd_node

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler")
    pytest.importorskip("ninja", reason="torch.utils.cpp_extension needs ninja")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        built = autograd_node.load()
    if built is None:
        pytest.fail("the C++ extension did not build (see the warning)")
    return built


@pytest.fixture
def no_tf32():
    """fp32 model comparisons on a GPU: TF32 convs round each differing input afresh, which swamps the
    GroupNorm differences under test (1e-3 after one conv on an H200)."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
