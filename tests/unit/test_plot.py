"""busbw_plot: a readable PNG of busbw against message size, written atomically."""
from __future__ import annotations

import os
import struct
import subprocess

import pytest
from unit_helpers import REPO_ROOT, VENV_PYTHON

from harness.report.plot import _tick_exponents, busbw_plot, ceiling_lines, size_label

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZES = [2 ** e for e in range(3, 31)]  # 8 B .. 1 GiB, nccl-tests -b 8 -e 1G -f 2


def _curve(peak_gbps: float, half_bytes: int) -> list[tuple[int, float]]:
    return [(s, peak_gbps * s / (s + half_bytes)) for s in SIZES]


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_two_collectives_with_a_ceiling_make_a_png(tmp_path):
    out = busbw_plot({"all_reduce": _curve(480, 1 << 22), "all_gather": _curve(360, 1 << 21)},
                     tmp_path / "busbw.png", title="h200: 8 ranks",
                     ceilings_gbps={"intra-node": 900.0, "inter-node": 0.0})
    assert out == tmp_path / "busbw.png"
    assert out.stat().st_size > 10_000  # a rendered plot, not an empty canvas
    width, height = _png_size(out)
    assert width > height > 300
    assert [p.name for p in tmp_path.iterdir()] == ["busbw.png"]  # no temp file left behind


def test_an_existing_plot_is_replaced_by_a_new_file_not_rewritten_in_place(tmp_path):
    path = tmp_path / "busbw.png"
    path.write_bytes(b"old plot")
    old_inode = path.stat().st_ino
    with open(path, "rb") as reader:  # a reader holding the old file still sees the old bytes
        busbw_plot({"all_reduce": _curve(40, 1 << 20)}, path, title="t", ceilings_gbps={})
        assert reader.read() == b"old plot"
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert path.stat().st_ino != old_inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busbw.png"]


def test_a_failed_render_leaves_the_old_plot_and_no_temp_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    path = tmp_path / "busbw.png"
    path.write_bytes(b"old plot")

    def broken_savefig(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        busbw_plot({"all_reduce": _curve(40, 1 << 20)}, path, title="t", ceilings_gbps={})
    assert path.read_bytes() == b"old plot"
    assert [p.name for p in tmp_path.iterdir()] == ["busbw.png"]


def test_missing_folders_are_created(tmp_path):
    out = busbw_plot({"all_reduce": _curve(40, 1 << 20)}, tmp_path / "a" / "b" / "p.png",
                     title="t", ceilings_gbps={"intra-node": 600.0})
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_a_non_positive_size_is_refused():
    with pytest.raises(ValueError, match="> 0 bytes"):
        busbw_plot({"all_reduce": [(0, 1.0), (8, 2.0)]}, REPO_ROOT / "never.png", title="t",
                   ceilings_gbps={})
    assert not (REPO_ROOT / "never.png").exists()


@pytest.mark.parametrize("size,label", [
    (1, "1"), (8, "8"), (512, "512"), (1024, "1K"), (1536, "1.5K"), (4096, "4K"),
    (1 << 20, "1M"), (256 << 20, "256M"), (1 << 30, "1G"), (8 << 30, "8G"), (1 << 40, "1T"),
])
def test_size_labels_are_human(size, label):
    assert size_label(size) == label


@pytest.mark.parametrize("lo,hi", [(3, 30), (3, 33), (0, 40), (10, 12), (20, 20)])
def test_ticks_stay_few_and_keep_1k_1m_1g_when_they_can(lo, hi):
    ticks = _tick_exponents(lo, hi)
    assert 1 <= len(ticks) <= 16
    assert all(lo <= e <= hi for e in ticks)
    if hi - lo < 32:
        assert {10, 20, 30} & set(range(lo, hi + 1)) <= set(ticks)


def test_ceilings_are_labelled_highest_first_and_zero_ones_left_out():
    assert ceiling_lines({"inter-node": 50.0, "intra-node": 900.0, "nvlink": 0.0}) == [
        ("intra-node 900 GB/s", 900.0), ("inter-node 50 GB/s", 50.0)]
    assert ceiling_lines({"inter-node": 0.0}) == []


def test_importing_the_module_does_not_import_matplotlib():
    code = "import sys, harness.report.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([VENV_PYTHON, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.stdout.strip() == "False"
