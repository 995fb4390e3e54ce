"""Verdict tables a person reads (issue 26 item 6): the terminal form fits 120 columns, rows name
their configuration by a label said in full once below, and what changed is said once for the rows
that share it (harness.report.verdicts.verdict_table, harness.report.legend)."""
from __future__ import annotations

import itertools
import re

import pytest
from test_report import legend, table_rows

from harness.verdict.compare import Verdict, worse_pct
from harness.report.legend import WIDTH, rows_text, wrap
from harness.report.verdicts import _flat, change_text, environment_text, interval_text, value_text, verdict_table

METRICS = {"samples_per_s": ("samples/s", "higher", 22.0), "tokens_per_s": ("tokens/s", "higher", 2816.0),
           "step_time_s": ("s", "lower", 0.364), "peak_mem_gib": ("GiB", "lower", 0.71),
           "mfu_pct": ("%", "higher", 41.7), "mfu_with_teacher_pct": ("%", "higher", 55.7)}
SUITE_COMMIT = {"suite_commit": ["bcccdb5c49aaaaaaaaaa", "113f2b2dbfbbbbbbbbbb"], "suite_commit.commits_between": 44}


def verdict(metric: str, config: dict | None, verdict: str = "regression", factor: float = 0.47,
            diff: dict | None = None, benchmark: str = "llama-tiny", reason: str = "") -> Verdict:
    """A Verdict as harness.verdict.compare builds it, `factor` times the reference in the better-is-higher sense."""
    unit, direction, ref = METRICS[metric]
    now = ref * factor if direction == "higher" else ref / factor
    w = worse_pct(now, ref, direction)
    gain = f"gain {-w:+.1f}% against {ref:g} {unit} (tolerance 15%; positive is better)"
    return Verdict("cpu", benchmark, config, metric, verdict, f"{reason}: {gain}" if reason else gain, unit=unit,
                   value=now, reference=ref, worse_pct=w, interval_pct=(w - 3.0, w + 3.0), tolerance_pct=15.0,
                   num_samples=3, num_reference_samples=5, run_ids=["r0"],
                   environment_diff=dict(diff or {}) if verdict in ("regression", "status changed") else {})


def long_config(i: int) -> dict:
    """A configuration of 8 keys besides the four a label starts with, most of them long."""
    return {"zero_stage": 1 + i % 3, "micro_batch_size": 2 ** (i % 4), "grad_acc_steps": 8 // 2 ** (i % 4),
            "seq_len": 4096, "nodes": 4, "num_ranks": 32, "precision": "bf16", "activation_checkpointing": i % 2 == 0,
            "optimizer": {"name": "adamw_torch_fused_with_decoupled_weight_decay", "lr_schedule": f"cosine-{i}"},
            "data": {"path": f"/lustre/project/datasets/tokenized/fineweb-edu-sample-100BT-shard-{i:04d}.bin"},
            "zero": {"offload_optimizer_device": "nvme_on_the_local_scratch_filesystem_of_every_node",
                     "stage3_prefetch_bucket_size": 500_000_000 + i}}


def long_diff() -> dict:
    """What changed on 8 nodes: the probe, the drivers, the NCCL variables, the links, the commit."""
    diff = {f"machine.gpu-node-{n:03d}.probe.bf16_matmul_gflops": [989.4, 612.0 + n] for n in range(8)}
    diff.update({"driver": ["550.54.15", "555.42.06"], "nccl": ["2.20.5", "2.21.5"],
                 "env.NCCL_IB_HCA": ["mlx5_0,mlx5_1,mlx5_2,mlx5_3", "mlx5_0,mlx5_3"],
                 "links.gpu-node-003/ib0": [400.0, 200.0], **SUITE_COMMIT})
    return diff


@pytest.fixture
def many() -> list[Verdict]:
    """8 long configurations x 6 metrics: regressions sharing one long environment difference, an
    insufficient data, passes on memory with the widest ratio ('0.990x (1.01x more memory)')."""
    out = []
    for i, metric in itertools.product(range(8), METRICS):
        if metric == "peak_mem_gib":
            out.append(verdict(metric, long_config(i), "pass", factor=0.99))
        elif i == 7:
            out.append(verdict(metric, long_config(i), "insufficient data", factor=0.8,
                               reason="point estimate out of tolerance, interval is not"))
        else:
            out.append(verdict(metric, long_config(i), diff=long_diff()))
    return out


def test_every_line_fits_120_columns_and_every_figure_is_there(many):
    text = verdict_table(many, missing="summary")
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, f"{len(too_wide)} lines over {WIDTH} columns, e.g. {too_wide[0]!r}"
    rows = table_rows(text, "verdict", markdown=False)
    assert len(rows) == len(many), "a row per configuration and metric"
    for v in many:   # no figure lost: each row has its value, reference, change, interval and samples
        figures = [v.metric, value_text(v.value), value_text(v.reference), change_text(v), interval_text(v), "3/5"]
        assert any(all(f in row for f in figures) for row in rows), (v.metric, figures)
    flat = " ".join(line.strip() for line in text.splitlines())
    assert environment_text(long_diff()) in flat, "the long difference is said in full (wrapped)"
    assert "tolerance (the now/ref a pass lies in): [0.85x, 1.15x]" in flat


def test_what_changed_for_six_rows_is_said_once():
    shared = {"torch": ["2.4.0", "2.5.1"], **SUITE_COMMIT}
    six = [verdict(m, long_config(0), diff=shared) for m in METRICS]
    other = [verdict("samples_per_s", long_config(1), diff={"nccl": ["2.20.5", "2.21.5"]})]
    for markdown in (False, True):
        text = verdict_table(six + other, markdown=markdown)
        flat = " ".join(line.strip() for line in text.splitlines())
        assert flat.count("torch: 2.4.0 -> 2.5.1") == 1 and flat.count("what changed since") == 2
        assert "regression, c1 (6 rows): what changed since the reference: torch: 2.4.0 -> 2.5.1; " \
               "suite_commit: bcccdb5c49 -> 113f2b2dbf (44 commits between)" in flat
        assert "regression, c2 samples_per_s: what changed since the reference: nccl: 2.20.5 -> 2.21.5" in flat
    text = verdict_table(six)
    assert text.count("what changed since") == 1 and "regression, all 6 rows: what changed" in text


def test_a_status_change_and_regressions_that_share_what_changed_say_it_once():
    shared = {"driver": ["550.54.15", "555.42.06"]}
    oom = Verdict("cpu", "llama-tiny", long_config(2), "samples_per_s", "status changed",
                  "ok -> oom: rank 0: OutOfMemoryError: CUDA out of memory", unit="samples/s", reference=22.0,
                  tolerance_pct=15.0, num_reference_samples=5, run_ids=["r1"], environment_diff=shared)
    text = verdict_table([verdict(m, long_config(0), diff=shared) for m in METRICS if m != "peak_mem_gib"] + [oom])
    flat = " ".join(line.strip() for line in text.splitlines())
    assert flat.count("driver: 550.54.15 -> 555.42.06") == 1
    assert "what changed since the reference, for 6 rows: driver: 550.54.15 -> 555.42.06" in flat
    assert "regression, all 5 rows" in flat and "status changed, c2 samples_per_s: ok -> oom: rank 0:" in flat


def test_every_label_has_one_legend_entry_with_its_full_configuration(many):
    for markdown in (False, True):
        text = verdict_table(many, markdown=markdown)
        rows = table_rows(text, "verdict", markdown)
        cells = [[c.strip() for c in (r.strip("|").split("|") if markdown else r.split("  ")) if c.strip()]
                 for r in rows]
        labels = sorted({c[2 if markdown else 1] for c in cells}, key=lambda x: int(x[1:]))
        assert labels == [f"c{i}" for i in range(1, 9)]
        flat = [line.strip() for line in text.splitlines()]
        common = note(text, "every configuration: ")
        for label in labels:
            entry = legend(text, label)
            assert sum(line.split()[:1] == [label] or line.startswith(f"- {label}: ") for line in flat) == 1
            (config,) = [c for c in (long_config(i) for i in range(8)) if c["data"]["path"] in entry]
            assert (f"ZeRO-{config['zero_stage']} mb {config['micro_batch_size']} x ga {config['grad_acc_steps']} "
                    "seq 4096") in entry
            rest = {k: v for k, v in _flat(config).items()
                    if k not in ("zero_stage", "micro_batch_size", "grad_acc_steps", "seq_len")}
            missing = [f"{k}={v}" for k, v in rest.items() if f"{k}={v}" not in entry and f"{k}={v}" not in common]
            assert not missing, (label, missing)


def note(text: str, start: str) -> str:
    """The note below a table that starts with `start`, its wrapped lines joined ('' if none)."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if line.lstrip("- ").startswith(start)), None)
    if at is None:
        return ""
    rest = itertools.takewhile(lambda line: line.startswith("    "), lines[at + 1:])
    return " ".join(line.strip() for line in [lines[at], *rest])


@pytest.mark.parametrize("config", [{}, None], ids=["empty", "none"])
def test_a_verdict_without_a_configuration_still_renders(config):
    alone = verdict("samples_per_s", config, benchmark="all_reduce")
    for verdicts in ([alone], [alone, verdict("samples_per_s", long_config(0))]):
        for markdown in (False, True):
            text = verdict_table(verdicts, markdown=markdown)
            rows = table_rows(text, "verdict", markdown)
            assert len(rows) == len(verdicts) and all(len(line) <= WIDTH for line in text.splitlines() if not markdown)
            assert legend(text, "c1").endswith("cpu/all_reduce"), "the label still names the benchmark"


def test_markdown_uses_the_same_labels_and_says_what_changed_once(many):
    md = verdict_table(many, markdown=True)
    assert md.splitlines()[0].startswith("| verdict | platform/benchmark | config | metric |")
    assert md.count(environment_text(long_diff())) == 1
    assert re.search(r"^- c1: cpu/llama-tiny ZeRO-1 mb 1 x ga 8 seq 4096 ", md, re.MULTILINE)


LABELS = ["c1", "c1", "c2", "c2", "c3", "c3", "c4", "c4"]
TWO_METRICS = ["samples_per_s", "tokens_per_s"] * 4


@pytest.mark.parametrize("rows,scope,expected", [
    ([0, 1, 2, 3], [0, 1, 2, 3], "all 4 rows"),
    ([2], range(8), "c2 samples_per_s"),
    ([0, 1, 2, 3], range(8), "c1-c2 (4 rows)"),
    ([0, 1, 2, 3, 6, 7], range(8), "c1-c2, c4 (6 rows)"),
    ([0, 1, 3], range(8), "c1, c2 (tokens_per_s)"),
    ([0, 2, 4, 6], range(8), "samples_per_s (4 rows)"),   # by metric, where that takes less than half the words
])
def test_a_set_of_rows_is_named_in_a_few_words(rows, scope, expected):
    assert rows_text(rows, list(scope), LABELS, TWO_METRICS) == expected


def test_wrapping_keeps_each_difference_whole_and_never_passes_the_width():
    diff = "; ".join(f"machine.node-{n:02d}.probe.fp32_matmul_gflops: {100 + n} -> {50 + n}" for n in range(9))
    lines = wrap(f"regression, all 29 rows: what changed since the reference: {diff}", "  ", "      ")
    assert len(lines) > 1 and all(len(line) <= WIDTH for line in lines)
    for n in range(9):   # no difference is cut between two lines
        assert any(f"node-{n:02d}.probe.fp32_matmul_gflops: {100 + n} -> {50 + n}" in line for line in lines)
    assert all(len(line) <= WIDTH for line in wrap("x" * 300, "  ", "      ")), "a word wider than the page is cut"
