"""Summary tables (harness.report.verdicts) as the user reads them at the end of `bench`."""
from __future__ import annotations

import io
import json

import pytest

from harness.record import ResultRecord
from harness.report.summary import Progress, summary


def collective(op, nbytes, time_s):
    return {"op": op, "bytes": nbytes, "time_s": time_s, "api": op, "phase": "backward"}


def microstep(index, total_s, comm_s, collectives):
    return {"index": index, "total_s": total_s, "compute_s": total_s - comm_s, "comm_s": comm_s,
            "collectives": collectives}


def record(run_id, status, reason, metrics, microsteps) -> ResultRecord:
    return ResultRecord(
        schema_version="1.0", run_id=run_id, kind="training", benchmark="llama-tiny", platform="cpu",
        status=status, reason=reason,
        config={"workload": {"micro_batch_size": 2, "grad_acc_steps": 3}, "zero": {"stage": 3}},
        overrides=[], environment={}, metrics=metrics, microsteps=microsteps)


def ok_metrics():
    def m(v, unit, **kw):
        return {"value": v, "unit": unit, "mode": "throughput", **kw}
    return {"samples_per_s": m(12.5, "samples/s"), "tokens_per_s": m(1600.0, "tokens/s"),
            "tokens_per_s_per_device": m(800.0, "tokens/s"),
            "step_time_s": m(1.28, "s", p10=1.2, p90=1.4, n=5), "peak_mem_gib": m(1.75, "GiB"),
            "mfu_pct": m(3.25, "%")}


# two profiled steps of three micro-steps; micro-step i totals (10+i) ms and (30+i) ms
PROFILED = [[microstep(i, (base + i) / 1e3, 0.004, [collective("all_gather", 2_000_000, 0.002),
                                                    collective("reduce_scatter", 1_000_000, 0.002)])
             for i in range(3)] for base in (10, 30)]


@pytest.fixture
def records():
    return [record("00-z3-mb2-ga3", "ok", None, ok_metrics(), PROFILED),
            record("01-z3-mb8-ga1", "oom", "rank 0: OutOfMemoryError: CUDA out of memory", {}, [])]


def table_rows(text: str, header_start: str, markdown: bool) -> list[str]:
    """The data rows of the table whose header line starts with header_start."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip("| ").startswith(header_start))
    rows = []
    for line in lines[start + 2:]:  # skip the header and its rule
        if not line.strip() or (markdown and not line.startswith("|")):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize("markdown", [False, True], ids=["terminal", "markdown"])
def test_summary_shows_every_run_the_failure_and_the_microstep_table(records, markdown):
    text = summary(records, markdown=markdown)
    assert "00-z3-mb2-ga3" in text and "01-z3-mb8-ga1" in text
    assert "01-z3-mb8-ga1: oom: rank 0: OutOfMemoryError: CUDA out of memory" in text

    throughput = table_rows(text, "run", markdown)
    assert len(throughput) == 2
    ok_row, oom_row = throughput
    for cell in ("ok", "2 x 3", "12.50", "1,600", "800", "1.280 (1.200-1.400, 5)", "1.75", "3.25"):
        assert cell in ok_row, cell
    assert "oom" in oom_row

    rows = table_rows(text, "micro-step", markdown)
    assert len(rows) == 3, "one row per micro-step"
    for i, row in enumerate(rows):
        cells = [c.strip() for c in (row.strip("|").split("|") if markdown else row.split("  ")) if c.strip()]
        assert cells[0] == str(i)
        assert cells[1] == f"{20.0 + i:.1f}"  # median of (10+i) and (30+i) ms
        assert cells[3] == "4.0"               # comm ms
        assert cells[4] == "0.0"               # held up ms: every call of a kind alike
        assert "all_gather x1 2.00 MB" in row and "reduce_scatter x1 1.00 MB" in row
    # a failed run has no micro-step breakdown
    assert text.count("ZeRO-3, mb 2 x ga 3") == 1


def test_markdown_summary_uses_pipe_tables(records):
    text = summary(records, markdown=True)
    assert "| run | status |" in text
    assert "| micro-step | total ms |" in text
    assert "|---|" in text
    assert text.count("## ") >= 2
    plain = summary(records)
    assert "|" not in plain


def test_progress_prints_one_line_per_complete_step(tmp_path):
    path = tmp_path / "events.jsonl"
    out = io.StringIO()
    progress = Progress(path, "00-tiny", 3, stream=out)
    progress.poll()  # no file yet: nothing, no error
    step = {"index": 0, "mode": "throughput", "warmup": True, "step_time_s": 0.25, "loss": 8.5}
    line = json.dumps({"time_ms": 1, "key": "train_step", "value": step, "metadata": {}}) + "\n"
    line2 = line.replace('"index": 0', '"index": 1').replace('"warmup": true', '"warmup": false')
    path.write_text(line + line2[:30], encoding="utf-8")
    progress.poll()
    path.write_text(line + line2, encoding="utf-8")
    progress.poll()
    assert out.getvalue().splitlines() == [
        "  00-tiny  step 1/3 (warm-up)  0.250 s  loss 8.5000",
        "  00-tiny  step 2/3 (throughput)  0.250 s  loss 8.5000"]


def test_a_distillation_run_gets_teacher_columns_and_its_teacher_collectives_apart():
    teacher_ms = [{**microstep(i, 0.05, 0.004, [{**collective("all_gather", 1_000_000, 0.001), "phase": "teacher"},
                                                collective("all_gather", 2_000_000, 0.002),
                                                collective("reduce_scatter", 1_000_000, 0.001)]),
                   "phase_s": {"teacher": 0.02, "forward": 0.01, "backward": 0.02}} for i in range(2)]
    rec = record("07-kd-z3-mb4-ga2", "ok", None,
                 {**ok_metrics(), "mfu_with_teacher_pct": {"value": 4.33, "unit": "%", "mode": "throughput"},
                  "teacher_mem_gib": {"value": 0.0047, "unit": "GiB", "mode": "throughput"}}, [teacher_ms])
    rec.config["workload"]["distill"] = {"alpha": 0.5, "temperature": 2.0, "teacher": {}}
    rec.flops = {"teacher": {"flops_per_token": 1.0}}
    text = summary([rec])
    assert "teacher GiB" in text and "MFU+teacher %" in text
    (row,) = table_rows(text, "run ", markdown=False)
    assert row.split()[-2:] == ["0.005", "4.33"]
    assert "07-kd-z3-mb4-ga2 (ZeRO-3, mb 2 x ga 3, teacher sharded by ZeRO-3)" in text
    rows = table_rows(text, "micro-step", markdown=False)
    assert len(rows) == 2
    assert rows[0].split()[5] == "20.0"  # teacher fwd ms, after held up ms
    assert "teacher all_gather x1 1.00 MB" in rows[0] and "all_gather x1 2.00 MB" in rows[0]


def test_a_compiled_run_gets_the_training_stack_table_with_its_caches_and_breaks_and_eager_runs_none(records):
    """What bench's summary shows of a run away from eager (workload.compile, kernels, fp8, attention): compile
    seconds with what the compilers' caches gave, graph breaks with where, recompilations, the SDPA that ran."""
    assert "Training stack" not in summary(records)
    where = "deepspeed/utils/timer.py:238 in start <- deepspeed/runtime/engine.py:2946 in _forward_prologue"
    rec = record("05-z1-compile", "ok", None,
                 {**ok_metrics(), "compile_s": {"value": 45.31, "unit": "s", "cache": "cold: 4 graphs compiled"},
                  "graph_breaks": {"value": 1, "unit": "count"}, "recompiles": {"value": 0, "unit": "count"}}, PROFILED)
    rec.config["workload"].update(compile="torch", kernels="eager", precision="bf16", attention="auto")
    rec.environment = {"stack": {"attention_used": ["cudnn"], "compile_watch": {"graph_break_reasons": [
        {"reason": "Attempted to call function marked as skipped", "count": 1, "where": [where]}]}}}
    for markdown in (False, True):
        text = summary([*records, rec], markdown)
        (row,) = table_rows(text.split("Training stack", 1)[1], "run", markdown)
        cells = [c.strip() for c in (row.strip("|").split("|") if markdown else row.split("  ")) if c.strip()]
        assert cells == ["05-z1-compile", "torch", "45.3", "cold: 4 graphs compiled", "1", "0", "cudnn"]
        assert f"05-z1-compile: graph break x1: Attempted to call function marked as skipped (at {where})" in text


# --- verdict tables (harness.report.verdicts.verdict_table) --------------------------------------------

def _verdict(metric, unit, direction, before, now, interval=None, config=None, verdict="regression", tol=10.0):
    """A Verdict as harness.verdict.compare builds it: worse_pct positive = worse, and its interval."""
    from harness.verdict.compare import Verdict, worse_pct

    w = worse_pct(now, before, direction, metric)
    return Verdict("cpu", "llama-tiny", config or dict(CONFIG), metric, verdict,
                   f"gain {-w:+.1f}% against {before:g} {unit} (tolerance {tol:g}%; positive is better)", unit=unit,
                   value=now, reference=before, worse_pct=w, interval_pct=interval or (w - 10.0, w + 10.0),
                   tolerance_pct=tol, num_samples=3, num_reference_samples=5, run_ids=["r0"])


CONFIG = {"nodes": 1, "num_ranks": 2, "zero_stage": 2, "micro_batch_size": 4, "grad_acc_steps": 2, "seq_len": 128,
          "precision": "fp32", "activation_checkpointing": False,
          "zero": {"stage3_max_live_parameters": 2000000, "stage3_prefetch_bucket_size": 200000}}


@pytest.mark.parametrize("metric,unit,direction,before,now,change", [
    ("step_time_s", "s", "lower", 1.07, 2.56, "0.42x (2.39x slower)"),
    ("samples_per_s", "samples/s", "higher", 22.0, 13.8, "0.63x (1.59x slower)"),
    ("step_time_s", "s", "lower", 2.56, 1.07, "2.39x (2.39x faster)"),
    ("samples_per_s", "samples/s", "higher", 13.8, 22.0, "1.59x (1.59x faster)"),
    ("peak_mem_gib", "GiB", "lower", 10.0, 12.5, "0.80x (1.25x more memory)"),
])
def test_every_change_reads_as_the_ratio_of_the_better_is_higher_quantity(metric, unit, direction, before, now, change):
    from harness.report.verdicts import change_text, interval_text, verdict_table, verdict_text

    v = _verdict(metric, unit, direction, before, now)
    assert change_text(v) == change
    text = verdict_table([v])
    md = verdict_table([v], markdown=True)
    for t in (text, md):
        (row,) = table_rows(t, "verdict", markdown=t is md)
        assert change in row and "%" not in row, "the table shows ratios, never a gain %"
        assert "below 1x is worse" in t, "the legend states the convention"
    assert f"{change}, 95% interval {interval_text(v)}" in verdict_text(v) and "gain " not in verdict_text(v)
    # the interval reads in the same terms, its ends around the point
    lo, hi = (float(x.rstrip("x")) for x in interval_text(v).strip("[]").split(", "))
    assert lo < float(change.split("x")[0]) < hi


def legend(text: str, label: str) -> str:
    """The legend entry of a configuration label below a verdict table ('  c1  cpu/llama-tiny ...' and
    its wrapped lines on the terminal, '- c1: ...' in Markdown), its lines joined."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == [label] or line.startswith(f"- {label}: "))
    entry = [lines[at]]
    for line in lines[at + 1:]:
        if not line.startswith("    "):   # the next entry or note (a wrapped line is indented further)
            break
        entry.append(line)
    return " ".join(line.strip() for line in entry)


def test_two_rows_differing_only_in_zero_stage_are_told_apart():
    from harness.report.verdicts import verdict_table

    z2 = _verdict("samples_per_s", "samples/s", "higher", 22.0, 13.8)
    z3 = _verdict("samples_per_s", "samples/s", "higher", 22.0, 13.8, config={**CONFIG, "zero_stage": 3})
    for markdown in (False, True):
        text = verdict_table([z2, z3], markdown=markdown)
        rows = table_rows(text, "verdict", markdown)
        assert len(rows) == 2 and rows[0] != rows[1]
        cells = [[c.strip() for c in (r.strip("|").split("|") if markdown else r.split("  ")) if c.strip()]
                 for r in rows]
        labels = [c[2 if markdown else 1] for c in cells]
        assert labels == ["c1", "c2"], "each configuration has a label of its own"
        assert "ZeRO-2 mb 4 x ga 2 seq 128" in legend(text, "c1") and "ZeRO-3 mb 4 x ga 2 seq 128" in legend(text, "c2")
    assert "regression, all 2 rows: what changed since the reference" in verdict_table([z2, z3])


def test_other_keys_that_tell_rows_apart_are_shown_in_full_and_the_rest_once():
    from harness.report.verdicts import verdict_table

    knobs = {**CONFIG, "zero": {**CONFIG["zero"], "overlap_comm": True}}
    text = verdict_table([_verdict("samples_per_s", "samples/s", "higher", 22.0, 21.0, verdict="pass"),
                          _verdict("samples_per_s", "samples/s", "higher", 22.0, 21.0, config=knobs, verdict="pass")])
    assert sorted("zero.overlap_comm=True" in legend(text, label) for label in ("c1", "c2")) == [False, True]
    assert all("precision" not in r for r in table_rows(text, "verdict", markdown=False))
    assert sum("precision" in line for line in text.splitlines()) == 1, "a key the same in every row is said once"
    assert "every configuration: activation_checkpointing=False nodes=1 num_ranks=2 precision=fp32 " \
           "zero.stage3_max_live_parameters=2000000 zero.stage3_prefetch_bucket_size=200000" in " ".join(
               line.strip() for line in text.splitlines())
