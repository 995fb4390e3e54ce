"""A machine without references of its own (issue 16 item 2): its first bench is its baseline in the
history store, and the next one is judged against it, so two benches in a row on a laptop pass."""
from __future__ import annotations

import copy

import pytest
from test_compare import record, reference

from harness.verdict.baseline import BASELINE_RUNS, baseline_text, judge, machine_key, store_url
from harness.verdict.compare import compare, decide
from harness.config.compose import compose
from harness.errors import ConfigError
from harness.verdict.references import Reference
from harness.report.verdicts import verdict_table
from unit_helpers import schema_valid, typed

LAPTOP = {"python": "3.11.7", "torch": "2.13.0", "env": {}, "suite_commit": "abc", "host": "laptop",
          "num_ranks": 16, "machine": {"cpu": {"model": "Intel Core i7-1185G7", "logical_cpus": 8}}}


def run(samples_per_s: float, i: int = 0, env: dict = LAPTOP) -> dict:
    rec = record(i, env=copy.deepcopy(env), samples_per_s=(samples_per_s, "samples/s"))
    rec["created_utc"] = f"2026-11-2{i}T10:00:00+00:00"
    return schema_valid(rec)


def bench(tmp_path, n: int, samples_per_s: float, references: list[Reference] = ()):
    out = tmp_path / f"bench{n}"
    out.mkdir(parents=True)
    records = [run(samples_per_s, n)]
    verdicts = compare(typed(records), list(references))
    return judge(typed(records), verdicts, "auto", out), verdicts


def test_the_first_bench_is_the_baseline_and_the_second_is_judged_against_it(tmp_path):
    first, _ = bench(tmp_path, 1, 20.0)
    assert first.verdicts == [] and first.unjudged == 1
    text = baseline_text(first, "")
    assert "they are its baseline now" in text and str(tmp_path / "history.sqlite") in text
    second, _ = bench(tmp_path, 2, 19.0)   # 5 % slower: within the tolerance
    sps = {v.metric: v for v in second.verdicts}["samples_per_s"]
    assert sps.verdict == "pass" and sps.reference == 20.0 and sps.num_reference_samples == 1
    assert "one sample on each side, within the tolerance" in sps.reason
    table = verdict_table(second.verdicts, ref_name="baseline")
    assert "Compared with this machine's earlier bench runs" in baseline_text(second, table)
    assert "Intel Core i7-1185G7 (8 CPUs)" in baseline_text(second, table)


def test_one_run_each_side_never_calls_a_regression_and_later_runs_bring_the_spread(tmp_path):
    bench(tmp_path / "a", 1, 20.0)
    slow, _ = bench(tmp_path / "a", 2, 10.0)
    assert {v.metric: v for v in slow.verdicts}["samples_per_s"].verdict == "insufficient data"
    for n, value in enumerate([20.0, 20.2, 19.8, 20.1, 19.9, 20.3], start=1):
        bench(tmp_path / "b", n, value)
    third, _ = bench(tmp_path / "b", 7, 10.0)
    sps = {v.metric: v for v in third.verdicts}["samples_per_s"]
    assert sps.verdict == "regression" and sps.num_reference_samples == BASELINE_RUNS
    assert third.earlier_runs == BASELINE_RUNS, "the last BASELINE_RUNS benches, no more"


def test_a_configuration_a_reference_of_this_machine_judged_is_not_judged_again(tmp_path):
    ref = reference([20.0, 20.5, 19.5], env=LAPTOP)
    bench(tmp_path, 1, 20.0, [ref])
    second, verdicts = bench(tmp_path, 2, 20.0, [ref])
    assert {v.verdict for v in verdicts} >= {"pass"}
    assert second.verdicts == [] and second.unjudged == 0 and baseline_text(second, "") == ""


def test_a_reference_of_another_machine_leaves_the_judging_to_this_machines_baseline(tmp_path):
    server = {**LAPTOP, "machine": {"cpu": {"model": "AMD EPYC 9654", "logical_cpus": 192}}}
    ref = reference([60.0, 61.0, 59.0], env=server)
    _, verdicts = bench(tmp_path, 1, 20.0, [ref])
    assert {v.metric: v for v in verdicts}["samples_per_s"].verdict == "not comparable"
    second, _ = bench(tmp_path, 2, 20.0, [ref])
    assert {v.metric: v for v in second.verdicts}["samples_per_s"].verdict == "pass"


def test_other_machines_keep_their_own_baselines(tmp_path):
    bench(tmp_path, 1, 20.0)
    other = {**LAPTOP, "machine": {"cpu": {"model": "Apple M3", "logical_cpus": 8}}}
    records = [run(5.0, 2, env=other)]
    result = judge(typed(records), compare(typed(records), []), "auto", tmp_path / "other")
    assert all(v.verdict == "new" for v in result.verdicts), "the M3 has no baseline yet; the i7's is not its"


def test_history_none_keeps_nothing_and_an_unusable_store_is_a_note_not_a_failure(tmp_path):
    records = [run(20.0)]
    none = judge(typed(records), compare(typed(records), []), "none", tmp_path / "a")
    assert none.verdicts == [] and "nothing kept" in baseline_text(none, "")
    assert not (tmp_path / "history.sqlite").exists()
    broken = judge(typed(records), compare(typed(records), []), "nosuchdriver://x", tmp_path / "b")
    assert "history store not used" in baseline_text(broken, "")


def test_where_the_store_is_and_what_a_machine_is_called(tmp_path):
    assert store_url("auto", tmp_path / "results" / "x") == f"sqlite:///{tmp_path / 'results' / 'history.sqlite'}"
    assert store_url("none", tmp_path) is None
    assert store_url("postgresql://h/db", tmp_path) == "postgresql://h/db"
    assert machine_key(typed([run(1.0)])) == "Intel Core i7-1185G7 (8 CPUs)"
    assert machine_key(typed([run(1.0, env={**LAPTOP, "machine": {"cpu": {"model": "x86_64"}}})])) == "host laptop"


@pytest.mark.parametrize("isa", ["AVX2", "AVX512 +avx512_bf16"])
def test_hosts_of_one_cpu_name_and_another_isa_keep_baselines_of_their_own(tmp_path, isa):
    """A cloud VM type's hosts read 'AMD EPYC (2 CPUs)' with AVX-512 on some and AVX2 on others (bf16 matmul 60x
    apart): the store keeps a baseline per ISA class, so an AVX2 host's bench is judged against AVX2 runs."""
    probe = {"device": "cpu", "isa": {"class": isa}, "matmul": {"fp32": {"gflops_per_core": 80.0}}}
    env = {**LAPTOP, "machine": {"cpu": {"model": "AMD EPYC", "logical_cpus": 2}, "probe": probe}}
    assert machine_key(typed([run(1.0, env=env)])) == f"AMD EPYC (2 CPUs, {isa})"


def test_the_history_key_is_checked():
    with pytest.raises(ConfigError, match="history"):
        compose(["history=somewhere"])


@pytest.mark.parametrize("now,verdict", [([19.5], "pass"), ([15.0], "insufficient data")])
def test_one_sample_on_each_side_passes_within_the_tolerance_only(now, verdict):
    assert decide(now, reference([20.0]))[0] == verdict


def test_benches_kept_before_the_cpus_kind_stay_the_boxs_baseline_and_another_kind_keeps_its_own(tmp_path):
    """A record that keeps its CPU's kind has another key ('...; family 6 model 140)'); the box's benches kept
    under the key without it are still its baseline (they may be either kind's), and a box of another kind under
    the same name never reads this kind's."""
    tiger = copy.deepcopy(LAPTOP)
    tiger["machine"]["cpu"]["id"] = {"vendor": "GenuineIntel", "family": 6, "model": 140, "stepping": 1}
    other = copy.deepcopy(LAPTOP)
    other["machine"]["cpu"]["id"] = {"vendor": "GenuineIntel", "family": 6, "model": 186, "stepping": 3}

    def bench_on(env: dict, n: int, value: float):
        out = tmp_path / f"bench{n}"
        out.mkdir()
        records = typed([run(value, n, env)])
        return judge(records, compare(records, []), "auto", out)
    assert bench_on(LAPTOP, 1, 20.0).earlier_runs == 0
    assert machine_key(typed([run(20.0, 2, tiger)])) == "Intel Core i7-1185G7 (8 CPUs; family 6 model 140)"
    second = bench_on(tiger, 2, 19.0)
    assert second.earlier_runs == 1 and {v.metric: v.verdict for v in second.verdicts}["samples_per_s"] == "pass"
    assert bench_on(other, 3, 30.0).earlier_runs == 1, "the kind-less bench only, not the other kind's"
    assert bench_on(tiger, 4, 19.5).earlier_runs == 2   # the kind-less bench and its own, not the other kind's
