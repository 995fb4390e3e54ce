"""The compiler's own figures judged (harness/verdict/compiled.py): Dynamo's graph breaks and recompilations
exactly, compile_s like a time but only between cold compiles."""
from __future__ import annotations

import copy

import pytest
from test_compare import ENV, record, reference

from harness.verdict.compare import compare
from harness.verdict.references import references_from_records
from contract.metrics import tolerances_for
from unit_helpers import typed

BREAK = "Unsupported: call_method UserDefinedObjectVariable(RotaryEmbedding) __call__"


def compiled_env(hits: int = 0, breaks: tuple[str, ...] = ()) -> dict:
    env = copy.deepcopy(ENV)
    env["stack"] = {"compile": "torch", "compile_watch": {
        "graph_breaks": len(breaks), "graph_break_reasons": [{"reason": b, "count": 1} for b in breaks],
        "recompiles": 0, "recompile_reasons": [],
        "cache": {"setting": "warm" if hits else "cold", "fx_graph": {"hit": hits, "miss": 2 - hits, "bypass": 0},
                  "aot_autograd": {"hit": 0, "miss": 1, "bypass": 0}}}}
    return env


def compiled(i: int, env: dict, compile_s: float, breaks: int = 0) -> dict:
    rec = record(i, env=env, compile_s=(compile_s, "s"), graph_breaks=(breaks, "count"), recompiles=(0, "count"))
    rec["config"]["workload"].update(compile="torch")
    return rec


def judged(new: list[dict], old: list[dict]) -> dict:
    refs = references_from_records(typed(old), source="old", submitter="t", date="2026-12-03", system="s",
                                   tolerance_pct=tolerances_for("roce-h100"))
    return {v.metric: v for v in compare(typed(new), refs)}


def test_a_new_graph_break_is_a_regression_named_in_dynamos_words_and_an_equal_count_passes():
    old = [compiled(i, compiled_env(), 30.0) for i in range(3)]
    broken = [compiled(i, compiled_env(breaks=(BREAK,)), 30.0, breaks=1) for i in range(3, 6)]
    v = judged(broken, old)["graph_breaks"]
    assert v.verdict == "regression" and v.tolerance_pct is None
    assert v.reason.startswith("1 graph break a run against the reference's 0: more (judged exactly); new: Unsupported")
    assert judged(old[:1], old)["graph_breaks"].verdict == "pass"          # one run a side is enough: exact
    assert judged(old, broken)["graph_breaks"].verdict == "improvement"
    assert judged(old, old)["recompiles"].verdict == "pass"


def test_compile_time_is_judged_between_cold_compiles_and_a_warm_side_is_not_comparable():
    old = [compiled(i, compiled_env(), s) for i, s in enumerate((30.0, 31.0, 29.5))]
    slow = [compiled(i, compiled_env(), s) for i, s in enumerate((61.0, 60.0, 62.5), start=3)]
    assert judged(slow, old)["compile_s"].verdict == "regression"
    warm = [compiled(i, compiled_env(hits=2), s) for i, s in enumerate((9.0, 10.0, 9.5), start=6)]
    v = judged(warm, old)["compile_s"]
    assert v.verdict == "not comparable" and v.value == 9.5
    assert v.reason == ("not comparable: compile time is judged between cold compiles only (measure.compile_cache="
                        "cold); the compilers' caches of this run: warm: 2 of 2 graphs from the cache")
    unknown = [compiled(i, ENV, 30.0) for i in range(9, 12)]   # a record from before the caches were counted
    assert judged(unknown, old)["compile_s"].verdict == "not comparable"


def test_a_references_compile_time_is_its_cold_runs_alone():
    """OLD ran twice with measure.compile_cache=warm: a cold first compile (60 s), then one from the cache (9 s):
    the reference is the cold one's, never the median of the two (34.5 s), and a cold NEW run is judged by it."""
    old = [compiled(0, compiled_env(), 60.0), compiled(1, compiled_env(hits=2), 9.0)]
    refs = references_from_records(typed(old), source="s", submitter="t", date="2026-12-03", system="s",
                                   tolerance_pct=tolerances_for("h100"))
    assert {r.metric: r for r in refs}["compile_s"].samples == (60.0,)
    assert judged([compiled(2, compiled_env(), 61.0)], old)["compile_s"].verdict == "pass"
    warm_only = references_from_records(typed(old[1:]), source="s", submitter="t", date="2026-12-03", system="s",
                                        tolerance_pct=tolerances_for("h100"))
    assert "compile_s" not in {r.metric for r in warm_only}


def test_an_eager_run_has_no_compiler_rows_even_when_it_failed_unknown():
    failed = typed([record(1, status="error")])
    assert not {"compile_s", "graph_breaks", "recompiles"} & {v.metric for v in compare(failed, [])}


def test_a_compiled_submission_carries_the_compilers_figures_as_references():
    refs = references_from_records(typed([compiled(i, compiled_env(), 30.0) for i in range(3)]), source="s",
                                   submitter="t", date="2026-12-03", system="s", tolerance_pct=tolerances_for("h100"))
    by = {r.metric: r for r in refs}
    assert by["compile_s"].value == 30.0 and by["compile_s"].tolerance_pct == 25.0
    assert by["graph_breaks"].value == 0 and by["recompiles"].direction == "lower"


@pytest.mark.parametrize("metric", ["graph_breaks", "recompiles"])
def test_the_counts_pass_the_submission_bounds_at_zero(metric):
    from contract.metrics import METRICS

    low, high, inclusive = METRICS[metric].bounds
    assert low < 0 <= high and inclusive


def test_the_table_shows_counts_as_whole_numbers():
    from harness.report.verdicts import verdict_table

    old = [compiled(i, compiled_env(), 30.0) for i in range(3)]
    row = next(line for line in verdict_table(list(judged(old[:1], old).values())).splitlines()
               if "graph_breaks" in line)
    assert row.split()[3:5] == ["0", "0"], row   # the reference's median 0.0 is 0, not 0.000
