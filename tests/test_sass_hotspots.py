"""scripts/sass_hotspots.py without a GPU: an ncu source page (per-SASS-instruction counters) in, basic
blocks, opcode shares and the busiest blocks out."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

sh = load_script("sass_hotspots", register=True)

HEADER = (
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
    '"# Samples","Instructions Executed"'
)


def page(rows: list[tuple[str, str, int, int]], kernel: str = "void k(GnArgs)") -> str:
    """An ncu --page source --csv file: ncu's messages, the kernel name, the header, rows of
    (address, sass, samples, executions), then a second kernel's page that must be ignored."""
    body = "\n".join(f'"{a}","{s}","{smp}","0","{smp}","{n:,}"' for a, s, smp, n in rows)
    return (
        "==PROF== Connected to process 1\n"
        f'"Kernel Name","{kernel}",\n{HEADER}\n{body}\n'
        '"Kernel Name","void other(GnArgs)",\n'
        f'{HEADER}\n"0x10","FADD R1, R1, R2","5","0","5","1"\n'
    )


ROWS = [
    ("0x00", "LDC R1, c[0x0][0x28]", 1, 4),  # prologue: 4 warps once
    ("0x10", "IMAD R2, R3, R4, RZ", 0, 4),
    ("0x20", "HADD2.F32 R5, -RZ, R6.H0_H0", 3, 64),  # loop body: 16 times per warp
    ("0x30", "@!P1 FFMA R7, R5, R8, R9", 5, 64),
    ("0x40", "FADD R9, R9, R7", 2, 64),
    ("0x50", "EXIT", 0, 4),
]


@pytest.fixture
def csv_file(tmp_path: Path) -> Path:
    p = tmp_path / "src.csv"
    p.write_text(page(ROWS))
    return p


def test_opcode_drops_predicates_and_modifiers() -> None:
    assert sh.opcode("@!P1 FSETP.GT.AND P3, PT, R32, 1, PT") == "FSETP"
    assert sh.opcode("HADD2.F32 R58, -RZ, R32.H0_H0") == "HADD2"
    assert sh.opcode("") == ""


def test_blocks_are_runs_of_equal_execution_counts_of_the_first_kernel(csv_file: Path) -> None:
    kernel, rows, header = sh.read_source_page(csv_file)
    assert kernel == "void k(GnArgs)"
    blocks = sh.blocks_of(rows, header)
    assert [(b.address, b.executions, len(b.sass), b.samples) for b in blocks] == [
        ("0x00", 4, 2, 1),
        ("0x20", 64, 3, 10),
        ("0x50", 4, 1, 0),
    ]
    assert sum(b.issued for b in blocks) == 4 * 2 + 64 * 3 + 4  # (the second kernel's page is not counted)


def test_report_ranks_blocks_by_instructions_issued(
    csv_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sh.main([str(csv_file), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("void k(GnArgs): 204 warp instructions, 11 stall samples, 3 blocks")
    busiest = out.split("blocks issuing most (of 3):\n")[1].splitlines()
    assert len(busiest) == 2
    assert busiest[0].split()[0] == "0x20" and "94.1 % of instructions" in busiest[0]
    assert "90.9 % of samples" in busiest[0]
    assert busiest[1].split()[0] == "0x00"


def test_show_prints_one_blocks_sass(csv_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sh.main([str(csv_file), "--show", "0x20"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "0x20: executed 64 times",
        "HADD2.F32 R5, -RZ, R6.H0_H0",
        "@!P1 FFMA R7, R5, R8, R9",
        "FADD R9, R9, R7",
    ]
    assert sh.main([str(csv_file), "--show", "0x99"]) == 1


def test_a_file_without_a_source_page_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "details.csv"
    p.write_text('"ID","Kernel Name","Metric Name"\n')
    with pytest.raises(ValueError, match="no 'Address' header"):
        sh.read_source_page(p)
