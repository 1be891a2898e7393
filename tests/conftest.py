import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def no_tf32():
    """fp32 model comparisons on a GPU: TF32 convs round each differing input afresh, which swamps the
    GroupNorm differences under test (1e-3 after one conv on an H200)."""
    import torch

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
