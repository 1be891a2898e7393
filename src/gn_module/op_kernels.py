"""The custom ops' kernels in C++ (`op_kernels.cpp`), for what torch.compile's graphs call.

A compiled graph calls ``gn_module::group_norm_fwd`` and ``group_norm_bwd`` through the dispatcher. With
the Python kernels (`ops.group_norm_fwd`, `ops._fwd_autograd`, ...) every call runs two Python functions,
Autograd then CUDA, around the body: in session 37's compiled UNet (benchmarks/RESULTS.md) its 58 calls
took 4.7 ms of a 45 ms step under cProfile. The C++ kernels do the same launches with the same bits, and
call back into Python only once per call signature (`ops._op_launch`) and for what the Python bodies
keep: launch records, poisoning and phase traces, calls with no wide launch, and eager calls that need a
gradient.

They live in the C++ autograd node's extension (`autograd_node`) and follow its switch: GN_CPP_NODE=0
keeps the Python kernels. `enable` runs when torch.compile first traces an op call on a CUDA tensor (the
op's fake kernel), so eager users never wait for the build on its account. The C++ kernels are registered
over the Python ones, which stay beneath them.
"""

from __future__ import annotations

import threading

from gn_module import autograd_node

_registration: object | None = None
_failed = False
_lock = threading.Lock()


def enabled() -> bool:
    """Whether the ops' CUDA and Autograd kernels are the C++ ones."""
    return _registration is not None


def enable() -> bool:
    """Register the C++ kernels for the ops (CUDA and Autograd keys), building the extension where needed.
    False where GN_CPP_NODE=0 or the extension cannot be built (then the Python kernels stay)."""
    global _registration, _failed
    if _registration is not None or _failed or not autograd_node.requested():
        return _registration is not None
    with _lock:
        if _registration is None and not _failed:
            node = autograd_node.load()
            if node is None:
                _failed = True
                return False
            from gn_module import ops

            set_callbacks(node)
            _registration = node.register_op_kernels("CUDA", autograd=True)  # type: ignore[attr-defined]
            ops._op_kernels = node
            ops._settings_changed()  # (launch records or poisoning may already be on)
    return _registration is not None


_callbacks_set = False


def set_callbacks(node: object) -> None:
    """Hand the extension the Python functions its kernels call back (once per process)."""
    global _callbacks_set
    if _callbacks_set:
        return
    from gn_module import ops

    # (looked up on each call, which is rare: a new signature, or a call the Python bodies keep)
    node.set_op_callbacks(  # type: ignore[attr-defined]
        lambda *args: ops._op_launch(*args),
        lambda *args: ops._sync_buffer_of(*args),
        lambda *args: ops.group_norm_fwd(*args),
        lambda *args: ops.group_norm_bwd(*args),
        lambda *args: ops._fwd_autograd(*args),
        list(ops.LAUNCH_ENVIRONMENT),
    )
    _callbacks_set = True
