"""The ptxas resource-report cache under concurrency: one process compiles an arch, the others wait for
its entry (an arch sweep's xdist workers each used to compile every profile's arch), with a fake nvcc."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FAKE_NVCC = textwrap.dedent(
    """\
    #!{python}
    import os, sys, time
    if "--version" in sys.argv:
        print("Cuda compilation tools, release 13.0, V13.0.88")
        sys.exit(0)
    with open(os.environ["FAKE_NVCC_LOG"], "a") as log:  # one line per source compiled
        log.write(sys.argv[-1] + "\\n")
    time.sleep(0.5)  # long enough for the other processes to find the entry missing
    print("ptxas info    : Compiling entry function '_ZN2gn9fwd_applyIfLi4EEEv6GnArgs' for 'sm_80'")
    print("ptxas info    : Used 40 registers, used 1 barriers")
    """
)

WORKER = textwrap.dedent(
    """\
    import sys
    from pathlib import Path
    from gn_module import resources
    report = resources.compile_arch("sm_80", Path(sys.argv[1]), nvcc=sys.argv[2])
    print(len(report.kernels), report.cached)
    """
)


@pytest.mark.parametrize("processes", [4])
def test_concurrent_processes_compile_each_source_once(tmp_path: Path, processes: int) -> None:
    root = tmp_path / "csrc"
    root.mkdir()
    for name in ("a.cu", "b.cu"):
        (root / name).write_text("// fake source\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "compiled.log"
    env = {**os.environ, "GN_CACHE_DIR": str(tmp_path / "cache"), "FAKE_NVCC_LOG": str(log)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(nvcc)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(processes)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    compiled = log.read_text().split()
    # each source once (the lock); without it every process compiles both: 2 x processes lines
    assert sorted(compiled) == sorted(str(root / n) for n in ("a.cu", "b.cu")), compiled
    assert all(o[0] == "2" for o in outs)  # every process got both kernels
    assert sum(o[1] == "True" for o in outs) == processes - 1  # the others read the compiler's entry


def test_only_compiles_the_named_sources_and_caches_them_apart(tmp_path: Path, monkeypatch) -> None:
    from gn_module import resources

    root = tmp_path / "csrc"
    root.mkdir()
    for name in ("a.cu", "b.cu", "c.cu"):
        (root / name).write_text("// fake source\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC.format(python=sys.executable).replace("time.sleep(0.5)", "pass"))
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "compiled.log"
    monkeypatch.setenv("GN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))

    def compiled() -> list[str]:
        names = sorted(Path(p).name for p in log.read_text().split()) if log.exists() else []
        log.unlink(missing_ok=True)
        return names

    picked = resources.compile_arch("sm_80", root, nvcc=str(nvcc), only=("b.cu",))
    assert compiled() == ["b.cu"] and len(picked.kernels) == 1 and not picked.cached
    assert resources.compile_arch("sm_80", root, nvcc=str(nvcc), only=("b.cu",)).cached and compiled() == []
    whole = resources.compile_arch("sm_80", root, nvcc=str(nvcc))  # its own entry: every source
    assert compiled() == ["a.cu", "b.cu", "c.cu"] and len(whole.kernels) == 3 and not whole.cached
    with pytest.raises(FileNotFoundError, match=r"d\.cu"):
        resources.compile_arch("sm_80", root, nvcc=str(nvcc), only=("b.cu", "d.cu"))


FAKE_NVCC_CUBIN = textwrap.dedent(
    """\
    #!{python}
    import os, sys
    if "--version" in sys.argv:
        print("Cuda compilation tools, release 13.0, V13.0.88")
        sys.exit(0)
    with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
        log.write(sys.argv[-1] + "\\n")
    open(sys.argv[sys.argv.index("-o") + 1], "w").close()  # the cubin cuobjdump reads
    print("ptxas info    : Compiling entry function '_ZN2gn6kernelEv' for 'sm_90'")
    print("ptxas info    : Used 100 registers, used 1 barriers")
    """
)
FAKE_CUOBJDUMP = textwrap.dedent(
    """\
    #!/bin/sh
    echo "	Function : _ZN2gn6kernelEv"
    echo "	/*0010*/  LDL R1, [R1+0x4] ;"
    echo "	/*0020*/  STL.64 [R1], R2 ;"
    echo "	/*0030*/  LDS R3, [R4] ;"
    """
)


def test_sass_local_counts_are_cached_apart_from_the_plain_report(tmp_path: Path, monkeypatch) -> None:
    # compile_arch(sass=True) reads each kernel's LDL/STL from the cubin's SASS, under its own cache entry;
    # the default entry (the plugin's) is unchanged and never carries counts
    from gn_module import resources

    root = tmp_path / "csrc"
    root.mkdir()
    (root / "a.cu").write_text("// fake source\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC_CUBIN.format(python=sys.executable))
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("cuobjdump", FAKE_CUOBJDUMP), ("nvdisasm", "#!/bin/sh\n")):
        (tools / name).write_text(text)
    for exe in (nvcc, tools / "cuobjdump", tools / "nvdisasm"):
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "compiled.log"
    monkeypatch.setenv("GN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    with_sass = resources.compile_arch("sm_90", root, nvcc=str(nvcc), sass=True)
    assert [k.local_accesses for k in with_sass.kernels] == [2] and not with_sass.cached
    again = resources.compile_arch("sm_90", root, nvcc=str(nvcc), sass=True)
    assert again.cached and [k.local_accesses for k in again.kernels] == [2]
    plain = resources.compile_arch("sm_90", root, nvcc=str(nvcc))
    assert not plain.cached and [k.local_accesses for k in plain.kernels] == [-1]
    assert len(log.read_text().split()) == 2  # once with the SASS, once without
    # without the tools: counts stay -1, in an entry of their own (never mistaken for counted ones)
    monkeypatch.setattr(resources, "sass_tools", lambda nvcc=None: None)
    blind = resources.compile_arch("sm_90", root, nvcc=str(nvcc), sass=True)
    assert not blind.cached and [k.local_accesses for k in blind.kernels] == [-1]
