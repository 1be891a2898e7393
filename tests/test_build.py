"""The JIT build on a machine without a GPU: nvcc compiles, the C ABI matches, failures are clear."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from gn_module import _abi, build

needs_nvcc = pytest.mark.skipif(
    shutil.which("nvcc") is None and not __import__("os").path.exists("/usr/local/cuda/bin/nvcc"),
    reason="nvcc (CUDA toolkit) not installed",
)


@needs_nvcc
def test_ptx_build_loads_and_abi_matches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GN_CACHE_DIR", str(tmp_path))
    path = build.build("compute_80")
    assert "building CUDA kernels" in capsys.readouterr().err
    lib = _abi.declare(ctypes.CDLL(str(path)))
    _abi.check_abi(lib)  # the C struct and the ctypes mirror agree
    assert build.build("compute_80") == path  # cached: no second build
    assert "building" not in capsys.readouterr().err
    # Without a GPU the entry points report a CUDA error instead of crashing.
    arch = ctypes.c_int(0)
    code = lib.gn_runtime_arch(0, ctypes.byref(arch))
    assert code != 0 and lib.gn_error_string(code)


@needs_nvcc
def test_a_stale_half_build_does_not_block_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("GN_CACHE_DIR", str(tmp_path))
    # What a build killed midway leaves: a work folder and a lock file, but no library.
    path = build.build("compute_86", quiet=True)
    entry = path.parent
    path.unlink()
    (entry / "build-killed").mkdir()
    (entry / "build-killed" / "gn_forward.o").write_bytes(b"partial")
    assert build.build("compute_86", quiet=True).is_file()


@needs_nvcc
def test_compile_errors_are_reported(tmp_path, monkeypatch):
    src = tmp_path / "csrc"
    shutil.copytree(build.csrc_dir(), src)
    (src / "gn_api.cu").write_text((src / "gn_api.cu").read_text() + "\nthis is not C++;\n")
    monkeypatch.setenv("GN_CSRC_DIR", str(src))
    monkeypatch.setenv("GN_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(build.BuildError, match="building the CUDA kernels failed"):
        build.build("compute_80", quiet=True)


def test_missing_nvcc_names_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setattr(build.Path, "is_file", lambda self: False)
    with pytest.raises(build.BuildError, match="CUDA toolkit"):
        build.find_nvcc()


def test_variant_names_are_checked():
    assert build.arch_flags("compute_80", None) == ["-gencode=arch=compute_80,code=compute_80"]
    assert build.arch_flags(None, (9, 0)) == ["-gencode=arch=compute_90,code=sm_90"]
    with pytest.raises(ValueError, match="compute_80"):
        build.arch_flags("sm_80", None)


def test_every_header_is_in_the_cache_key(tmp_path):
    """An edit to any header of the sources' folder rebuilds (the key once listed five headers by hand,
    so a header split off later would have kept stale builds)."""
    src = tmp_path / "csrc"
    shutil.copytree(build.csrc_dir(), src)
    names = build.headers(src)
    assert {"gn_tasks.cuh", "gn_task_backward.cuh", "gn_api.h"} <= set(names)
    base = build._entry_key(src, [], "13.0")
    for name in names:
        original = (src / name).read_text()
        (src / name).write_text(original + "\n// edited\n")
        assert build._entry_key(src, [], "13.0") != base, name
        (src / name).write_text(original)
    assert build._entry_key(src, [], "13.0") == base
