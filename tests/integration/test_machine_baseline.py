"""Two benches in a row on a machine with no reference of its own (issue 16 item 2): the first is
the machine's baseline in the history store, the second is judged against it. A configuration
the shipped references do not have (seq_len 64) stands for any laptop's: its verdicts are the
machine's baseline ones, whatever the box's speed (one run a side never calls a regression)."""
from __future__ import annotations

import itertools

import pytest

from .conftest import machine_moved, run_bench, until_the_machine_holds

pytestmark = pytest.mark.integration

ARGS = ("suite=single", "workload.seq_len=64", "measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=1")


def second_bench(tmp_path):
    """The second bench: its out folder, its comparison section and the verdict rows; again while the
    machine measured itself otherwise than the first bench (conftest.until_the_machine_holds: an AMX
    core's fp32 F.linear once read 49 against 86 GFLOP/s a minute apart)."""
    def attempt(k: int):
        out = tmp_path / ("second" if k == 1 else f"second-{k}")
        second = run_bench(out, *ARGS)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        section = second.stdout.split("Compared with this machine's earlier bench runs", 1)
        assert len(section) == 2, second.stdout[-3000:]
        lines = section[1].splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("verdict"))   # the table's header
        rows = [line.split() for line in itertools.takewhile(str.strip, lines[start + 2:])]
        return (out, section[1], rows), machine_moved(lines)

    return until_the_machine_holds(tmp_path / "history.sqlite", attempt)


def test_the_second_bench_is_judged_against_the_first(tmp_path):
    first = run_bench(tmp_path / "first", *ARGS)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "they are its baseline now" in first.stdout and str(tmp_path / "history.sqlite") in first.stdout
    out, section, rows = second_bench(tmp_path)
    assert len(rows) == 6, section      # samples/s, tokens/s, step time, memory, MFU, matmul efficiency
    # one run a side: within the tolerance "pass", beyond it "insufficient data" (or "not comparable" when
    # the machine's pace explains it, on a box that moved in every attempt), never a regression
    assert all(row[0] in ("pass", "insufficient", "improvement", "not") for row in rows), section
    assert any(row[0] == "pass" and "peak_mem_gib" in row for row in rows), "memory moves by little"
    assert "This machine's baseline" in (out / "compare.md").read_text()
