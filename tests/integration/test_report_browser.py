"""The nightly's page opened in headless Chromium at 1400 px, as a person opens it (issue 29 item 3):
a month of nights of a cpu-cluster-like suite (six training configurations, three collectives), the
last one on a slower link, so that every configuration regresses against its baseline. The page
must load with no console error and every figure, be no wider than the window, say on its first
screen how the night went and what changed, and stay under 2 MB. The screenshot is kept in the
test's folder (its path is printed). The real night of the emulated cluster is opened the same way
in tests/integration/test_cpu_cluster.py."""
from __future__ import annotations

import datetime

import pytest

from harness.verdict.compare import Verdict, worse_pct
from harness.record import ResultRecord
from harness.verdict.references import REFERENCE_METRICS
from harness.report.nightly import write_reports
from harness.report.nightly_page import series_label

from ..browser import render

pytestmark = pytest.mark.integration
NIGHTS = 30
MAX_PAGE_BYTES = 2 * 2**20
LINK_CHANGE = {"links.node1/eth0": [1.0, 0.25], "links.node2/eth0": [1.0, 0.25]}
TRAINING = [(z, mb, 8 // mb) for z in (1, 2, 3) for mb in (2, 4)]
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def _nights() -> list[str]:
    first = datetime.date(2026, 10, 1)
    return [(first + datetime.timedelta(days=i)).isoformat() for i in range(NIGHTS)]


def _run_id(z: int, mb: int, ga: int) -> str:
    return f"0{z}-z{z}-mb{mb}-ga{ga}"


def _record(run_id: str, z: int, slow: float) -> ResultRecord:
    micro = [{"index": i, "total_s": 0.3 * slow, "compute_s": 0.2, "comm_s": 0.1 * slow * (1 + (i == 1)),
              "collectives": []} for i in range(4)]
    return ResultRecord(schema_version="1.0", run_id=run_id, kind="training", benchmark="llama-tiny",
                        platform="cpu-cluster", status="ok", reason=None, config={}, overrides=[],
                        environment={}, metrics={"samples_per_s": {"value": 10 / slow, "unit": "1/s"}},
                        microsteps=[micro])


def _month():
    """(verdicts, records, history, previous) of the last night of the month."""
    nights = _nights()
    history, baseline, references = {}, [], []

    def add(platform_bench: tuple[str, str], config: dict, metric: str, unit: str, value: float, direction: str,
            run_id: str):
        label = series_label(*platform_bench, config)
        slow = 4.0 if metric in ("samples_per_s", "tokens_per_s", "step_time_s", "avg_busbw_gbps") else 1.0
        last = value / slow if direction == "higher" else value * slow
        history[f"{label} {metric}"] = [(n, value * (1 + 0.02 * ((i * 7) % 5 - 2) / 2)) for i, n in enumerate(nights[:-1])]
        history[f"{label} {metric}"].append((nights[-1], last))
        worse = worse_pct(last, value, direction, metric) if slow > 1 else 0.5   # as compare gives it
        kind = "regression" if slow > 1 else "pass"
        baseline.append(Verdict("cpu-cluster", platform_bench[1], config, metric, kind,
                                f"gain {'-' if slow > 1 else ''}{worse:.1f}%", unit=unit, value=last, reference=value,
                                worse_pct=worse, tolerance_pct=10.0, num_samples=2, num_reference_samples=14,
                                run_ids=[run_id], environment_diff=LINK_CHANGE if slow > 1 else {}))
        references.append(Verdict("cpu-cluster", platform_bench[1], config, metric, "pass", "gain +1.0%", unit=unit,
                                  value=last, reference=value * 0.99, worse_pct=-1.0, tolerance_pct=10.0,
                                  num_samples=2, num_reference_samples=5, run_ids=[run_id]))

    units = {"samples_per_s": "1/s", "tokens_per_s": "1/s", "step_time_s": "s", "peak_mem_gib": "GiB", "mfu_pct": "%"}
    for z, mb, ga in TRAINING:
        config = {"zero_stage": z, "micro_batch_size": mb, "grad_acc_steps": ga, "seq_len": 128,
                  "activation_checkpointing": False, "precision": "bf16"}
        for metric, unit in units.items():
            add(("cpu-cluster", "llama-tiny"), config, metric, unit, {"step_time_s": 1.2, "peak_mem_gib": 0.7,
                                                                       "mfu_pct": 0.4}.get(metric, 10.0 * mb),
                REFERENCE_METRICS["training"][metric], _run_id(z, mb, ga))
    for op in COLLECTIVES:
        config = {"min_bytes": 1024, "max_bytes": 16 * 2**20, "dtype": "float", "redop": "sum"}
        add(("cpu-cluster", op), config, "avg_busbw_gbps", "GB/s", 0.11, "higher", f"00-collectives-{op}")
    records = [_record(_run_id(z, mb, ga), z, 4.0) for z, mb, ga in TRAINING]
    previous = {r.run_id: (nights[-2], _record(r.run_id, 1, 1.0)) for r in records}
    return {"references": references, "baseline": baseline}, records, history, previous


def test_a_month_of_nights_reads_in_a_browser_at_1400_px(chromium_browser, tmp_path):
    verdicts, records, history, previous = _month()
    night = _nights()[-1]
    paths = write_reports(tmp_path / "night", platform="cpu-cluster", night=night, verdicts=verdicts,
                          records=records, history=history, previous=previous)
    size = paths["html"].stat().st_size
    print(f"nightly.html over {NIGHTS} nights: {size / 2**10:.0f} KiB")
    assert size < MAX_PAGE_BYTES

    shown = render(paths["html"], screenshot=tmp_path / "nightly-first-screen.png", binary=chromium_browser)
    print(f"screenshot: {shown.screenshot}")
    assert shown.errors == []
    assert shown.window_width == 1400 and shown.page_width <= shown.window_width
    assert len(shown.images) == 1 + len(TRAINING) and all(i["complete"] and i["width"] > 0 for i in shown.images)
    assert sum("beside the night" in i["alt"] for i in shown.images) == len(TRAINING)   # each regressed run
    first = shown.first_screen
    assert f"{len(TRAINING) * 3 + len(COLLECTIVES)} regression(s) or status change(s)" in first
    assert "what changed: links.node1/eth0: 1.0 -> 0.25; links.node2/eth0: 1.0 -> 0.25" in first
    assert "regression c3 (cpu-cluster/llama-tiny ZeRO-1 mb 2 x ga 4" in first    # a training configuration
    assert "regression c1 (cpu-cluster/all_gather" in first                      # and a collective
