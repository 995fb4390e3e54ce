"""tests/perf/cluster_model.py's view of a run's load: other processes leave a run out of the model's
check, the hypervisor's steal (environment.load.steal_cpus) is read from the record and shown beside
it, per run and per configuration, and leaves nothing out."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.perf import cluster_model
from tests.perf.cluster_model import STOLEN_AT_MOST_PCT, ClusterModelCheck, Verdict, steal_cpus, stolen_pct, stolen_share


def rec(run_id: str, steal=None, kind: str = "training"):
    load = {} if steal is None else {"steal_cpus": steal}
    return SimpleNamespace(run_id=run_id, kind=kind, environment={"load": load})


def test_steal_is_read_from_the_records_load():
    assert steal_cpus(rec("z1", 0.62)) == 0.62
    assert steal_cpus(rec("z1")) is None                                       # bare metal, or an older record
    assert steal_cpus(rec("z1", "0.6")) is None                                # not a number: unread
    assert steal_cpus(SimpleNamespace(environment=None)) is None


def test_other_work_leaves_a_run_out_and_steal_is_shown_but_leaves_none_out(tmp_path: Path, monkeypatch, capsys):
    check = ClusterModelCheck("c", "default-cpu-cluster", tmp_path, max_other_cpus=0.2)
    check.dirs = {"cpu": [tmp_path / "cpu-0"], "cluster": [tmp_path / "cluster-0"]}
    runs = {"cpu-0": [rec("z1", 0.12), rec("z2", 0.1)], "cluster-0": [rec("z1", 0.62), rec("z2", None)]}
    other = {("cpu-0", "z1"): 0.01, ("cpu-0", "z2"): 0.5, ("cluster-0", "z1"): 0.02, ("cluster-0", "z2"): 0.03}
    seen: dict = {}

    def records(folders):
        seen["folder"] = folders[0].name
        return runs[folders[0].name]

    monkeypatch.setattr(cluster_model, "load_records", records)
    monkeypatch.setattr(check.load, "during", lambda r: other[(seen["folder"], r.run_id)])
    kept = check.quiet()
    assert [r.run_id for r in kept["cpu"]] == ["z1"]                          # 0.5 CPUs of other work: out
    assert [r.run_id for r in kept["cluster"]] == ["z1", "z2"]                # 0.62 of steal: kept
    out = capsys.readouterr().out
    assert "cluster-0/z1: 0.02, steal 0.62\n" in out and "cluster-0/z2: 0.03, steal -\n" in out
    assert "cpu-0/z2: 0.50, steal 0.10  LEFT OUT" in out


def test_a_verdict_carries_the_steal_of_its_runs():
    v = Verdict("z1", predicted_s=0.96, measured_s=1.277, runs=1, steal_cpus=0.62)
    assert round(v.error_pct, 1) == -24.8 and v.steal_cpus == 0.62
    assert Verdict("z1", 1.0, 1.0, 1).steal_cpus is None


def test_a_verdicts_bound_widens_by_the_rounds_spread_and_below_by_the_shared_cores():
    one_round = Verdict("z1", predicted_s=0.96, measured_s=1.166, runs=1, compute_delta_pct=2.0)
    assert one_round.bound(15) == (-17.0, 15.0) and not one_round.within(15)    # -17.7 %
    two_rounds = Verdict("z1", predicted_s=0.96, measured_s=1.166, runs=2, spread_pct=19.1)
    assert two_rounds.bound(15) == (-34.1, 34.1) and two_rounds.within(15)
    assert not Verdict("z1", predicted_s=1.4, measured_s=1.0, runs=2, spread_pct=10, compute_delta_pct=50).within(15)


def test_a_verdicts_bound_widens_above_by_a_slower_calibration():
    """The single node computed longer than the cluster did: the model carries that time (CI of 80bdd5b,
    ZeRO-1 +21.9 % with two rounds 4 % apart)."""
    slow_calibration = Verdict("z1", predicted_s=1.085, measured_s=0.890, runs=2, spread_pct=4.0,
                               compute_delta_pct=-20.0)
    assert slow_calibration.bound(15) == (-19.0, 39.0) and slow_calibration.within(15)
    assert "20.0 % of the step shorter than the single node" in slow_calibration.computed()
    assert not Verdict("z1", 1.085, 0.890, runs=2, spread_pct=4.0).within(15)      # no such measurement: +21.9 % fails
    assert not Verdict("z1", 1.6, 1.0, runs=2, spread_pct=4.0, compute_delta_pct=-20.0).within(15)  # +60 %
    assert "7.6 % of the step longer" in Verdict("z3", 1.0, 1.0, 1, compute_delta_pct=7.6).computed()


def machine_rec(run_id: str, steal, cpus: int = 2):
    return SimpleNamespace(run_id=run_id, kind="training",
                           environment={"load": {"steal_cpus": steal}, "machine": {"cpu": {"logical_cpus": cpus}}})


def test_the_stolen_share_of_the_box_is_steal_over_its_cpus_capped():
    assert stolen_pct(machine_rec("z1", 0.39)) == 19.5
    assert stolen_pct(machine_rec("z1", 0.91)) == STOLEN_AT_MOST_PCT == 30.0     # 45.5 %: capped
    assert stolen_pct(machine_rec("z1", 0.5, cpus=8)) == 6.25
    assert stolen_pct(machine_rec("z1", None)) == 0.0 and stolen_pct(rec("z1")) == 0.0
    assert stolen_share(machine_rec("z1", 0.37).environment) == 0.185                 # the link-rate test's share


def test_a_verdicts_bound_widens_on_each_side_by_that_sides_steal():
    """2026-12-03 on this 2-core VM: ZeRO-1 -37.2 % (model 0.996 s, measured 1.587 s) with the hypervisor
    taking 0.91 CPUs during the cluster's runs; in CI +22.7 % with the single node's runs stolen from."""
    stolen_cluster = Verdict("z1", predicted_s=0.996, measured_s=1.587, runs=2, spread_pct=3.0,
                             compute_delta_pct=5.0, steal_cpus=0.91, cluster_stolen_pct=30.0)
    assert stolen_cluster.bound(15) == (-48.0, 18.0) and stolen_cluster.within(15)
    assert not Verdict("z1", 0.996, 1.587, runs=2, spread_pct=3.0, compute_delta_pct=5.0).within(15)
    stolen_calibration = Verdict("z1", predicted_s=1.227, measured_s=1.0, runs=2, spread_pct=5.5,
                                 calibration_stolen_pct=12.0)
    assert stolen_calibration.bound(15) == (-20.5, 32.5) and stolen_calibration.within(15)
    assert not Verdict("z1", 1.227, 1.0, runs=2, spread_pct=5.5, cluster_stolen_pct=12.0).within(15)  # the wrong side
    # the larger of the two measurements counts, not their sum; a model off by 2x still fails
    both = Verdict("z1", 1.0, 1.0, 1, compute_delta_pct=-20.0, calibration_stolen_pct=10.0)
    assert both.bound(15) == (-15.0, 35.0)
    assert not Verdict("z1", 2.0, 1.0, 1, calibration_stolen_pct=30.0).within(15)
    assert "0.91 CPUs during the cluster's runs (30 % of the box counted), 0 % during the single node's" \
        in stolen_cluster.stolen()
