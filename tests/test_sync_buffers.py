"""The task kernels' synchronisation words without a GPU (ops._sync_buffer): a buffer per (device, stream),
grown geometrically with the outgrown ones kept (a captured CUDA graph keeps their address), and allocated
by a helper thread unless the stream is being captured: torch.compile's CUDA graphs route the calling
thread's allocations into their memory pool during warm-up, and refuse a pool block that is not an output
(tests/gpu/test_compile_cudagraphs.py runs it for real)."""

from __future__ import annotations

import threading

import pytest
import torch

from gn_module import ops


class FakeCuda:
    """torch.zeros and the torch.cuda calls _zeros_outside_graph_pools makes, recording the thread of each
    allocation; `capturing` is what torch.cuda.is_current_stream_capturing answers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capturing: bool = False) -> None:
        self.threads: list[int] = []
        self.capturing = capturing
        real_zeros = torch.zeros

        def zeros(size, dtype=None, device=None):
            self.threads.append(threading.get_ident())
            return real_zeros(size, dtype=dtype)

        monkeypatch.setattr(torch, "zeros", zeros)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: self.capturing)
        monkeypatch.setattr(torch.cuda, "device", lambda device: _Nothing())
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Stream:
    def synchronize(self) -> None:
        return None


@pytest.fixture(autouse=True)
def _fresh_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_sync_buffers", {})
    monkeypatch.setattr(ops, "_outgrown_sync_buffers", [])


CUDA0 = torch.device("cuda", 0)  # (a device object only: nothing is allocated on it here)


def test_allocated_by_another_thread_outside_a_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda(monkeypatch)
    buf = ops._sync_buffer(CUDA0, 7, 100)
    assert buf.numel() == 1024 and not buf.any()
    assert len(fake.threads) == 1 and fake.threads[0] != threading.get_ident()
    assert ops._sync_buffer(CUDA0, 7, 1024) is buf  # cached per (device, stream)
    other = ops._sync_buffer(CUDA0, 8, 10)
    assert other is not buf and len(fake.threads) == 2


def test_allocated_in_the_capture_while_capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda(monkeypatch, capturing=True)
    ops._sync_buffer(CUDA0, 7, 100)
    assert fake.threads == [threading.get_ident()]


def test_outgrown_buffers_stay_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(monkeypatch)
    small = ops._sync_buffer(CUDA0, 7, 100)
    large = ops._sync_buffer(CUDA0, 7, 5000)
    assert large.numel() == 5000 and ops._outgrown_sync_buffers == [small]
    assert ops._sync_buffer(CUDA0, 7, 3000) is large
    assert ops._sync_buffer(CUDA0, 7, 6000).numel() == 10000  # (geometric: twice the last)
    assert ops._outgrown_sync_buffers == [small, large]


def test_an_allocation_error_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(monkeypatch)

    def out_of_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise torch.OutOfMemoryError("no room")

    monkeypatch.setattr(torch, "zeros", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match="no room"):
        ops._sync_buffer(CUDA0, 7, 100)
    assert ops._sync_buffers == {}
