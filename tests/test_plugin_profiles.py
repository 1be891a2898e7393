"""Profile table, user profile files and the ptxas parser (CPU only, no nvcc needed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gn_module import profiles, resources
from gn_module.schedule import KernelResources, blocks_per_sm, model_residency, tiling


def test_builtin_profiles_cover_issue_table() -> None:
    expect = {
        "A100": ((8, 0), 108), "RTX3090": ((8, 6), 82), "A10": ((8, 6), 72), "Orin": ((8, 7), 16),
        "L4": ((8, 9), 58), "RTX4090": ((8, 9), 128), "H100": ((9, 0), 132), "H200": ((9, 0), 132),
        "B200": ((10, 0), 148), "Thor": ((11, 0), 20), "RTX5090": ((12, 0), 170), "GB10": ((12, 1), 48),
    }  # fmt: skip
    table = {p.name: (p.cc, p.sm_count) for p in profiles.BUILTIN_PROFILES}
    assert table == expect


@pytest.mark.parametrize(
    ("name", "threads", "blocks", "smem"),
    [("A100", 2048, 32, 164), ("A10", 1536, 16, 100), ("Orin", 1536, 16, 164), ("L4", 1536, 24, 100),
     ("H200", 2048, 32, 228), ("B200", 2048, 32, 228), ("Thor", 1536, 24, 228), ("GB10", 1536, 24, 100)],
)  # fmt: skip
def test_per_sm_limits(name: str, threads: int, blocks: int, smem: int) -> None:
    p = profiles.get_profile(name)
    assert (p.max_threads_per_sm, p.max_blocks_per_sm, p.smem_per_sm) == (threads, blocks, smem * 1024)
    assert p.max_smem_per_block == p.smem_per_sm - 1024
    assert (p.regs_per_sm, p.reg_alloc_unit, p.reserved_smem_per_block) == (65536, 256, 1024)


def test_a100_occupancy_matches_calculator() -> None:
    # 100 regs x 256 threads: 3328 regs/warp after 256-unit rounding -> 2 blocks by registers.
    a100 = profiles.get_profile("a100")
    assert blocks_per_sm(a100, KernelResources(100), 256, 33 * 1024) == 2
    assert blocks_per_sm(a100, KernelResources(32), 256, 0) == 8  # thread-limited
    t = tiling(128, 16, 1 << 20, 2, "fwd")
    per_sm = blocks_per_sm(a100, KernelResources(64), 256, t.onepass_smem)
    assert model_residency(a100, KernelResources(64), t) == 108 * per_sm


def test_lookup_by_name_and_arch() -> None:
    assert profiles.get_profile("rtx-4090").name == "RTX4090"
    assert profiles.get_profile("sm_110").name == "Thor"
    with pytest.raises(KeyError, match="2 profiles have arch sm_90"):
        profiles.get_profile("sm_90")
    with pytest.raises(KeyError, match=r"unknown GPU profile 'V100'.*known profiles: A100"):
        profiles.get_profile("V100")
    chosen = profiles.select_profiles("a100, thor", profiles.BUILTIN_PROFILES)
    assert [p.name for p in chosen] == ["A100", "Thor"]
    assert len(profiles.select_profiles("all", profiles.BUILTIN_PROFILES)) == len(profiles.BUILTIN_PROFILES)


def test_parse_cc() -> None:
    assert profiles.parse_cc("8.6") == profiles.parse_cc("sm_86") == profiles.parse_cc([8, 6]) == (8, 6)
    assert profiles.parse_cc("sm_121") == (12, 1)
    with pytest.raises(ValueError, match="compute capability"):
        profiles.parse_cc("ampere")


def test_profiles_file_toml_and_json(tmp_path) -> None:
    toml = tmp_path / "gpus.toml"
    toml.write_text(
        '[profiles.MiniAmpere]\ncc = "8.6"\nsm_count = 10\n\n[profiles.Odd]\ncc = "7.5"\n'
        "sm_count = 40\nmax_threads_per_sm = 1024\nmax_blocks_per_sm = 16\nsmem_per_sm = 65536\n"
    )
    mini, odd = profiles.load_profiles_file(toml)
    assert (mini.name, mini.cc, mini.sm_count, mini.max_blocks_per_sm) == ("MiniAmpere", (8, 6), 10, 16)
    assert (odd.cc, odd.max_smem_per_block) == ((7, 5), 65536 - 1024)
    js = tmp_path / "gpus.json"
    js.write_text(json.dumps({"profiles": [{"name": "J", "cc": "sm_90", "sm_count": 8}]}))
    assert profiles.load_profiles_file(js)[0].arch == "sm_90"


@pytest.mark.parametrize(
    ("content", "match"),
    [('[profiles.X]\ncc = "8.6"\n', "lacks 'sm_count'"),
     ('[profiles.X]\ncc = "7.0"\nsm_count = 4\n', "not in the built-in table"),
     ('[profiles.X]\ncc = "8.0"\nsm_count = 4\nwarp = 3\n', "unknown field"),
     ("[profiles.X\n", "invalid TOML")],
)  # fmt: skip
def test_bad_profiles_file(tmp_path, content: str, match: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        profiles.load_profiles_file(path)


def test_user_profile_replaces_builtin() -> None:
    mine = profiles.profile_from_mapping({"name": "a100", "cc": "8.0", "sm_count": 7})
    merged = profiles.merge_profiles(profiles.BUILTIN_PROFILES, [mine])
    assert profiles.get_profile("A100", merged).sm_count == 7
    assert len(merged) == len(profiles.BUILTIN_PROFILES)


def test_limits_from_torch_like_properties() -> None:
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                            max_threads_per_multi_processor=2048, shared_memory_per_multiprocessor=233472,
                            shared_memory_per_block_optin=232448, regs_per_multiprocessor=65536)  # fmt: skip
    lim = profiles.limits_from_properties(props)
    assert lim == profiles.limits_for("NVIDIA H200", (9, 0), 132)
    future = SimpleNamespace(name="future", major=13, minor=0, multi_processor_count=4)
    assert profiles.limits_from_properties(future).max_blocks_per_sm == 24  # nearest older: sm_121


MANGLED = [
    ("_ZN2gn11fwd_onepassI6__halfLi8EEEv6GnArgs", "fwd_onepass[fp16,vec8]"),
    ("_ZN2gn11bwd_onepassI13__nv_bfloat16Li1EEEv6GnArgs", "bwd_onepass[bf16,vec1]"),
    ("_ZN2gn9fwd_tilesIfLi4EEEv6GnArgs", "fwd_tiles[fp32,vec4]"),
    ("_ZN2gn11fwd_combineIfEEv6GnArgs", "fwd_combine[fp32]"),
    ("_ZN2gn12level_reduceE6GnArgs", "level_reduce"),
    # the task kernels' wide type: x's own (a back-reference, or fp32's code again) is left out
    ("_ZN2gn14fwd_task_applyI13__nv_bfloat16Li8ES1_EEv6GnArgs", "fwd_task_apply[bf16,vec8]"),
    ("_ZN2gn14bwd_task_statsIfLi4EfEEv6GnArgs", "bwd_task_stats[fp32,vec4]"),
    ("_ZN2gn14bwd_task_applyI6__halfLi8EfEEv6GnArgs", "bwd_task_apply[fp16,vec8,wide]"),
    # a variant flag: false (the default instantiation) keeps the plain name, true names the variant
    ("_ZN2gn14bwd_task_statsI6__halfLi8ES1_Lb0EEEv6GnArgs", "bwd_task_stats[fp16,vec8]"),
    ("_ZN2gn14bwd_task_statsI6__halfLi8ES1_Lb1EEEv6GnArgs", "bwd_task_stats[fp16,vec8,cold]"),
    ("_ZN2gn14bwd_task_statsI6__halfLi8EfLb1EEEv6GnArgs", "bwd_task_stats[fp16,vec8,wide,cold]"),
    ("_ZN2gn9some_kernI6__halfLi8ELb1EEEv6GnArgs", "some_kern[fp16,vec8,true]"),  # a bool of no variant
    ("_ZN2gn3fooI7MyThingEEvv", "_ZN2gn3fooI7MyThingEEvv"),  # unknown template argument: kept raw
    ("_Z6kernelPf", "_Z6kernelPf"),
    ("report_arch", "report_arch"),
]


@pytest.mark.parametrize(("mangled", "readable"), MANGLED)
def test_readable_kernel_names(mangled: str, readable: str) -> None:
    assert resources.readable_name(mangled) == readable


def test_launch_resources_plan_for_the_heavier_variant() -> None:
    """The launcher may pick bwd_task_stats' cold variant after capping the grid: residency must hold
    for whichever it launches."""

    def kernel(name: str, registers: int, smem: int) -> resources.KernelReport:
        return resources.KernelReport(name, name, "sm_90", "gn_backward_tasks.cu", registers, smem)

    report = resources.ArchReport("sm_90", "13.0", "x", [
        kernel("bwd_task_stats[fp16,vec8]", 96, 256), kernel("bwd_task_stats[fp16,vec8,cold]", 128, 128),
        kernel("bwd_task_stats[fp16,vec1]", 90, 0), kernel("fwd_task_onepass[fp16,vec8]", 80, 0),
    ])  # fmt: skip
    assert report.resources("bwd_task_stats[fp16,vec8]") == KernelResources(96, 256)
    assert report.launch_resources("bwd_task_stats[fp16,vec8]") == KernelResources(128, 256)
    assert report.launch_resources("bwd_task_stats[fp16,vec1]") == KernelResources(90, 0)  # no cold variant
    assert report.launch_resources("fwd_task_onepass[fp16,vec8]") == KernelResources(80, 0)
    with pytest.raises(KeyError, match="no kernel 'bwd_task_stats\\[fp32,vec4\\]'") as missing:
        report.launch_resources("bwd_task_stats[fp32,vec4]")
    # the message names the same kernel's configurations only (session 34: the whole list, 100 names per case)
    text = str(missing.value)
    assert "fwd_task_onepass" not in text and "bwd_task_stats[fp16,vec8,cold]" in text
    with pytest.raises(KeyError, match=r"compiled: bwd_task_stats.*fwd_task_onepass"):
        report.resources("no_such_kernel[fp16,vec8]")


PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN2gn11fwd_onepassI6__halfLi8EEEv6GnArgs' for 'sm_80'
ptxas info    : Function properties for _ZN2gn11fwd_onepassI6__halfLi8EEEv6GnArgs
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 100 registers, used 1 barriers, 2048 bytes smem, 640 bytes cmem[0]
ptxas info    : Compile time = 18.655 ms
ptxas info    : Function properties for _ZN2gn6helperEv
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_ZN2gn11bwd_onepassIfLi4EEEv6GnArgs' for 'sm_80'
ptxas info    : Function properties for _ZN2gn11bwd_onepassIfLi4EEEv6GnArgs
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 24 bytes lmem
"""


def test_parse_ptxas() -> None:
    fwd, bwd = resources.parse_ptxas(PTXAS, source="x.cu")
    assert (fwd.name, fwd.arch, fwd.registers, fwd.static_smem, fwd.barriers) == (
        "fwd_onepass[fp16,vec8]",
        "sm_80",
        100,
        2048,
        1,
    )
    assert not fwd.spills and fwd.resources == KernelResources(100, 2048)
    assert (bwd.spill_stores, bwd.spill_loads, bwd.local_bytes, bwd.stack_bytes) == (20, 16, 24, 24)
    assert bwd.spills and "20/16 B spill" in bwd.describe()


def test_missing_nvcc_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GN_NVCC", str(tmp_path / "nope"))
    with pytest.raises(resources.NvccNotFound, match="does not exist"):
        resources.find_nvcc()
    monkeypatch.delenv("GN_NVCC")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(resources.Path, "is_file", lambda self: False)
    with pytest.raises(resources.NvccNotFound, match="install the CUDA toolkit"):
        resources.find_nvcc()
