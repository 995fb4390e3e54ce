"""A regression one run of a bench reads is run again before the bench calls it (harness/verdict/confirmation.py,
config key confirm_regressions): which runs, under which ids, and what the bench says of a reading that repeated
and of one that did not. The launches are the suite's own (tests/integration/test_confirm_regressions.py); here
`execute` returns the reruns' records, so the verdicts are decided on known values."""
from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

import harness.bench
from harness.bench import compare_with_references, confirm_regressions, plan_suite
from harness.errors import ConfigError
from harness.record import ResultRecord
from harness.verdict.compare import Verdict
from harness.verdict.confirmation import first_run_id, rerun_name, rerun_number, to_confirm
from harness.verdict.references import ReferenceTables

from test_bench_verdicts import ran, table


def test_a_rerun_stands_for_its_first_run():
    assert rerun_name("z2-mb4-ga2", 1) == "z2-mb4-ga2-confirm1"
    assert first_run_id("03-z2-mb4-ga2-confirm1") == "03-z2-mb4-ga2"
    assert first_run_id("00-collectives-confirm2-all_reduce") == "00-collectives-all_reduce"   # a sweep's record
    assert first_run_id("01-collectives-all_reduce-confirm10") == "01-collectives-all_reduce"   # nccl-tests' run
    for plain in ("00-collectives-all_reduce", "02-confirmed", "04-x-confirm"):
        assert first_run_id(plain) == plain and rerun_number(plain) == 0
    assert [rerun_number(i) for i in ("03-z2-confirm10", "00-collectives-confirm2-all_reduce")] == [10, 2]


def test_the_runs_to_confirm_are_those_whose_records_regressed():
    def verdict(run_id: str, what: str) -> Verdict:
        return Verdict("cpu", "reduce_scatter", {}, "small_median_us", what, "", run_ids=[run_id])
    runs = {"00-collectives": [f"00-collectives-{op}" for op in ("all_reduce", "reduce_scatter")],
            "01-z1-mb2-ga4": ["01-z1-mb2-ga4"], "02-z2-mb2-ga4": ["02-z2-mb2-ga4"]}
    found = [verdict("00-collectives-reduce_scatter", "regression"), verdict("01-z1-mb2-ga4", "pass"),
             verdict("02-z2-mb2-ga4", "regression"), verdict("00-collectives-all_reduce", "regression")]
    assert to_confirm(found, runs) == ["00-collectives", "02-z2-mb2-ga4"]
    assert to_confirm(found[1:2], runs) == []


def bench_of(tmp_path, monkeypatch, first: float, reruns: list[float], *args: str, history: str = "none",
             environment: Optional[dict] = None):
    """A bench of one llama-tiny run (ZeRO-2, mb 4 x ga 2, the table's configuration at 22 samples/s, 25 %) whose
    first run read `first` samples/s and whose reruns read `reruns` (a status where one failed): what it launched
    again, and what it said. `history`: the config key; `environment`: the records' (a machine for the store)."""
    monkeypatch.setattr(harness.bench, "read_references", lambda paths=None: ReferenceTables(table(), []))
    out, planned = plan_suite(["suite=single", "zero=stage2", "workload.micro_batch_size=4", f"history={history}",
                               f"out={tmp_path / 'out'}", *args])
    launched = []

    def record(run_id: str, value: float) -> ResultRecord:
        rec = dataclasses.replace(ran(0, value), run_id=run_id)
        return dataclasses.replace(rec, environment={**rec.environment, **(environment or {})})

    def execute(again, out, multirun=False, keep_compile_cache=()):
        launched.extend(p.run for p in again)
        return [record(p.run.run_id, v) if isinstance(v, float) else
                dataclasses.replace(record(p.run.run_id, 1.0), status=v, reason="rank 1 exited 1", metrics={})
                for p, v in zip(again, reruns)]

    monkeypatch.setattr(harness.bench, "execute", execute)
    records = [record(planned[0].run.run_id, first)]
    records, first_verdicts = confirm_regressions(records, planned, out)
    compare_with_references(records, out, planned[0].cfg.history, first_verdicts, planned[0].cfg.confirm_regressions)
    return launched, records, (out / "compare.md").read_text()


def test_a_reading_that_does_not_repeat_is_judged_on_the_median_of_the_runs(tmp_path, monkeypatch, capsys):
    launched, records, md = bench_of(tmp_path, monkeypatch, 15.0, [22.1, 21.9])
    assert records[0].run_id == "00-llama-tiny"
    assert [r.run_id for r in launched] == ["00-llama-tiny-confirm1", "00-llama-tiny-confirm2"]
    assert all(r.run_dir.parent == tmp_path / "out" / "runs" for r in launched), "each rerun has its own folder"
    assert len({r.run_dir for r in launched}) == 2 and all(r.run_id != records[0].run_id for r in launched)
    printed = capsys.readouterr().out
    assert "1 run(s) read a regression in their first run" in printed
    for text in (printed, md):
        assert ("Regressions run again (confirm_regressions=2): 2 regression(s) of 1 run(s) in their first run, 0 "
                "of them on all the runs together") in text    # samples/s and step time
        assert ("00-llama-tiny: llama-tiny samples_per_s read 15.000 samples/s against 22.000 in its first run; its "
                "reruns 22.100, 21.900: pass on the median of 3 runs (21.900 samples/s): the first run's reading did not "
                "repeat (1 of 3 runs beyond the tolerance)") in text
    judged = md.split("# Regressions run again")[0]
    assert "3 pass" in judged and "| regression" not in judged


def test_a_reading_that_repeats_stays_a_regression_and_says_so(tmp_path, monkeypatch):
    _, records, md = bench_of(tmp_path, monkeypatch, 15.0, [14.8, 15.2])
    assert len(records) == 3
    assert "its reruns 14.800, 15.200: regression, confirmed: 3 of 3 runs read it" in md
    assert "2 regression(s) of 1 run(s) in their first run, 2 of them on all the runs together" in md


def test_a_rerun_that_failed_is_named_by_its_status(tmp_path, monkeypatch):
    _, records, md = bench_of(tmp_path, monkeypatch, 15.0, [14.9, "error"])
    assert [r.status for r in records] == ["ok", "ok", "error"]
    assert "its reruns 14.900, error: regression, confirmed: 2 of 2 runs read it" in md


def test_no_rerun_when_nothing_regressed_or_when_turned_off(tmp_path, monkeypatch):
    launched, records, md = bench_of(tmp_path, monkeypatch, 21.5, [1.0, 1.0])
    assert launched == [] and len(records) == 1 and "Regressions run again" not in md
    launched, records, md = bench_of(tmp_path / "off", monkeypatch, 15.0, [22.0, 22.0], "confirm_regressions=0")
    assert launched == [] and len(records) == 1 and "Regressions run again" not in md
    assert "regression" in md


@pytest.mark.parametrize("value", ["-1", "11"])
def test_a_bad_count_is_refused_before_anything_runs(tmp_path, value):
    with pytest.raises(ConfigError, match=rf"confirm_regressions={value} is invalid: runs more of a run that read "
                                          r"a regression, in \[0, 10\]"):
        plan_suite(["suite=single", f"confirm_regressions={value}", f"out={tmp_path}"])


def test_reruns_that_cannot_start_leave_the_first_runs_judged(tmp_path, monkeypatch, capsys):
    """A rerun that cannot be planned or launched (an nccl-tests binary gone since the suite started, a preflight
    that fails) costs the confirmation only: the first runs keep their summary and verdicts."""
    from harness.errors import HarnessError

    def gone(*args, **kwargs):
        raise HarnessError("collective.source='nccl-tests' but the all_reduce binary is not in PATH")

    monkeypatch.setattr(harness.bench, "plan_rerun", gone)
    launched, records, md = bench_of(tmp_path, monkeypatch, 15.0, [22.0, 22.0])
    assert launched == [] and len(records) == 1 and "Regressions run again" not in md and "regression" in md
    assert "the regressions were not run again: collective.source='nccl-tests' but the all_reduce binary" \
        in capsys.readouterr().out


def test_a_rerun_is_planned_as_its_first_run_was_under_its_own_id(tmp_path):
    """A built-in sweep and a training run by plan_run, an nccl-tests op's run by its binary (stand-ins here): the
    same command, op and ranks, the first run's index, its own id and folder."""
    from harness.config.schema import REPO_ROOT
    from harness.plan import plan_rerun

    for op in ("all_reduce", "all_gather"):
        (tmp_path / f"{op}_perf").write_text("#!/bin/sh\n")
        (tmp_path / f"{op}_perf").chmod(0o755)
    out, planned = plan_suite(["suite=single", "kind=collective", "collective.source=nccl-tests",
                               f"collective.nccl_tests_dir={tmp_path}", "collective.ops=[all_reduce,all_gather]",
                               "platform=h100", f"out={tmp_path / 'out'}"])
    first = planned[1].run
    again = plan_rerun(first, planned[1].cfg, rerun_name(first.name, 1), out, REPO_ROOT, REPO_ROOT / ".cache")
    assert (first.run_id, again.run_id) == ("01-collectives-main-all_gather", "01-collectives-main-all_gather-confirm1")
    assert again.argv[1:] == first.argv[1:] and again.argv[0] == str(tmp_path / "all_gather_perf")
    assert (again.output, again.spec.ops, again.num_ranks) == ("nccl-tests", ["all_gather"], 1)
    assert again.run_dir == out / "runs" / again.run_id and first_run_id(again.record_ids()[0]) == first.run_id

    out, planned = plan_suite(["suite=default-cpu", "only=[collectives,z2-mb4-ga2]", f"out={tmp_path / 'cpu'}"])
    for p in planned:
        again = plan_rerun(p.run, p.cfg, rerun_name(p.run.name, 2), out, REPO_ROOT, REPO_ROOT / ".cache")
        assert again.run_id == f"{p.run.run_id}-confirm2" and again.spec.__class__ is p.run.spec.__class__
        assert [first_run_id(i) for i in again.record_ids()] == p.run.record_ids()
        assert again.argv == [*p.run.argv[:-1], str(again.run_dir)] and again.overrides == p.run.overrides


def test_a_reading_that_a_rerun_read_too_but_the_median_does_not_call_is_unsettled(tmp_path, monkeypatch):
    """A neighbour's spell that lasted into the first rerun (seen on the Zen 5 EPYC beside a CPU burner: 27.4, 26.3,
    36.9 samples/s against 37.5): neither a confirmed regression nor a first reading alone."""
    _, records, md = bench_of(tmp_path, monkeypatch, 15.0, [15.5, 22.0])
    assert ("its reruns 15.500, 22.000: insufficient data on the median of 3 runs (15.500 samples/s): unsettled, 2 of "
            "3 runs read it beyond the tolerance (more runs would tell)") in md
