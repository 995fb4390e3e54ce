"""Performance portability (harness.verdict.portability): Pennycook's PP from references and records.

Expected values are worked by hand here (explicit harmonic means), never by the code under test.
"""
from __future__ import annotations

import json

import pytest

from harness.errors import HarnessError
from harness.verdict.portability import (Observation, application_efficiency, cli, observations_from_references, pennycook,
                                 portability)
from harness.verdict.references import REFERENCE_DIR, load_references
from unit_helpers import schema_valid

PLATFORMS = ["ib-a100", "roce-a100", "roce-h100"]
PAPER = "A. Perez Dieguez et al., SC'25 PMBS (slides)"


def ref(platform, config, value, metric="samples_per_s", status="ok", benchmark="llama-8b-kd",
        direction="higher", unit="samples/s"):
    return {"platform": platform, "benchmark": benchmark, "config": config, "metric": metric,
            "value": value, "unit": unit, "direction": direction, "tolerance_pct": 5.0, "status": status,
            "samples": [] if value is None else [value], "num_samples": 0 if value is None else 1,
            "provenance": {"source": PAPER, "submitter": "test", "date": "2025-11-17", "system": platform,
                           "environment": None, "suite_commit": None, "note": None}}


def write_refs(tmp_path, entries, name="refs.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"schema_version": "1.0", "references": entries}), encoding="utf-8")
    return path


def step2(stage, mb, ga):
    return {"nodes": 4, "zero_stage": stage, "micro_batch_size": mb, "grad_acc_steps": ga}


# The published step-3 table (model2_step3_tuned.csv) plus a few step-2 cells, one OOM on only one
# platform (made up for the test: the published OOM cells are OOM on all three).
FIXTURE = (
    [ref(p, {"tuning": "baseline"}, v) for p, v in zip(PLATFORMS, (65.78, 58.51, 92.35))]
    + [ref(p, {"tuning": "tuned", "overlap_comm": oc, "gradient_collective": "reduce_scatter"}, v)
       for p, v, oc in zip(PLATFORMS, (90.71, 79.9, 146.37), (False, False, True))]
    + [ref(p, step2(2, 128, 2), v) for p, v in zip(PLATFORMS, (76.489, 72.891, 134.0))]
    + [ref("ib-a100", step2(2, 256, 1), 80.0), ref("roce-a100", step2(2, 256, 1), None, status="oom"),
       ref("roce-h100", step2(2, 256, 1), 140.0)]
)
BASELINE_PP = 3 / (90.71 / 65.78 + 79.9 / 58.51 + 146.37 / 92.35)   # = 0.69292
Z2_MB128_PP = 3 / (90.71 / 76.489 + 79.9 / 72.891 + 146.37 / 134.0)


@pytest.fixture
def fixture_refs(tmp_path):
    return load_references([write_refs(tmp_path, FIXTURE)])


def by_app(results):
    return {r.application: r for r in results}


# --- the metric --------------------------------------------------------------------------------

@pytest.mark.parametrize("effs, platforms, expected", [
    ({"a": 1.0, "b": 1.0}, ["a", "b"], 1.0),
    ({"a": 0.5, "b": 1.0}, ["a", "b"], 2 / (2 + 1)),
    ({"a": 0.25, "b": 0.5, "c": 1.0}, ["a", "b", "c"], 3 / (4 + 2 + 1)),
    ({"a": 0.8}, ["a"], 0.8),
    ({"a": 0.5, "b": None}, ["a", "b"], 0.0),           # unsupported on b
    ({"a": 0.5, "b": 0.0}, ["a", "b"], 0.0),            # zero efficiency
    ({"a": 0.5}, ["a", "b"], 0.0),                      # no result on b at all
    ({"a": 0.5, "b": None}, ["a"], 0.5),                # b is not in H
    ({"a": 1.0 + 1e-12, "b": 1.0}, ["a", "b"], 1.0),    # rounding slack
])
def test_pennycook_is_harmonic_mean_and_zero_when_unsupported(effs, platforms, expected):
    assert pennycook(effs, platforms) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("effs", [{"a": 0.5, "roce-h100": 1.2}, {"a": 0.5, "roce-h100": -0.1},
                                  {"a": None, "roce-h100": 1.5}, {"a": 0.5, "roce-h100": float("nan")}])
def test_pennycook_rejects_efficiency_outside_unit_interval_naming_platform(effs):
    with pytest.raises(HarnessError, match="roce-h100"):
        pennycook(effs, ["a", "roce-h100"])


def test_pennycook_needs_platforms():
    with pytest.raises(HarnessError, match="at least one platform"):
        pennycook({"a": 1.0}, [])


def test_application_efficiency_higher_lower_and_unsupported():
    assert application_efficiency({"a": 50.0, "b": None, "c": 100.0}, {"a": 100.0, "c": 100.0}, "higher") \
        == {"a": 0.5, "b": None, "c": 1.0}
    assert application_efficiency({"a": 2.0, "b": 0.5}, {"a": 1.0, "b": 0.5}, "lower") == {"a": 0.5, "b": 1.0}
    with pytest.raises(HarnessError, match="'b'"):
        application_efficiency({"b": 1.0}, {}, "higher")
    with pytest.raises(HarnessError, match="direction"):
        application_efficiency({"a": 1.0}, {"a": 1.0}, "up")


# --- from references ---------------------------------------------------------------------------

def test_published_baseline_and_tuned_pp(fixture_refs):
    res = by_app(portability(observations_from_references(fixture_refs, "llama-8b-kd"),
                             "samples_per_s", "application", PLATFORMS))
    assert res["tuned"].pp == pytest.approx(1.0)
    assert [e.efficiency for e in res["tuned"].efficiencies] == pytest.approx([1.0, 1.0, 1.0])
    assert res["baseline"].pp == pytest.approx(BASELINE_PP, rel=1e-9)
    assert res["baseline"].pp == pytest.approx(0.69292, abs=5e-6)   # 3 / (1.37899 + 1.36558 + 1.58495)
    assert [e.efficiency for e in res["baseline"].efficiencies] == \
        pytest.approx([65.78 / 90.71, 58.51 / 79.9, 92.35 / 146.37])
    assert res["z2-mb128-ga2"].pp == pytest.approx(Z2_MB128_PP, rel=1e-9)


def test_oom_on_one_platform_makes_pp_zero(fixture_refs):
    res = by_app(portability(observations_from_references(fixture_refs, "llama-8b-kd"),
                             "samples_per_s", "application", PLATFORMS))["z2-mb256-ga1"]
    assert res.pp == 0.0
    assert [(e.platform, e.supported, e.status) for e in res.efficiencies] == \
        [("ib-a100", True, "ok"), ("roce-a100", False, "oom"), ("roce-h100", True, "ok")]
    # without the platform where it runs out of memory, it is portable again
    two = by_app(portability(observations_from_references(fixture_refs, "llama-8b-kd"),
                             "samples_per_s", "application", ["ib-a100", "roce-h100"]))["z2-mb256-ga1"]
    assert two.pp == pytest.approx(2 / (90.71 / 80.0 + 146.37 / 140.0))


def test_lower_is_better_metric_inverts_efficiency(tmp_path):
    entries = [ref(p, step2(s, 8, 1), t, metric="step_time_s", direction="lower", unit="s",
                   benchmark="llama-tiny")
               for p, s, t in (("a", 1, 2.0), ("a", 2, 1.0), ("b", 1, 3.0), ("b", 2, 4.0))]
    obs = observations_from_references(load_references([write_refs(tmp_path, entries)]), "llama-tiny")
    res = by_app(portability(obs, "step_time_s", "application", ["a", "b"]))
    assert res["z1-mb8-ga1"].pp == pytest.approx(2 / (2.0 / 1.0 + 1.0))        # e = 0.5, 1.0
    assert res["z2-mb8-ga1"].pp == pytest.approx(2 / (1.0 + 4.0 / 3.0))        # e = 1.0, 0.75


def test_unknown_status_row_when_platform_has_no_result(tmp_path):
    obs = [Observation("x", {}, "a", "samples_per_s", 10.0, "ok", "t"),
           Observation("y", {}, "a", "samples_per_s", 20.0, "ok", "t"),
           Observation("y", {}, "b", "samples_per_s", 5.0, "ok", "t")]
    res = by_app(portability(obs, "samples_per_s", "application", ["a", "b"]))
    assert res["x"].pp == 0.0 and res["x"].efficiencies[1].status == "no data"
    assert res["y"].pp == pytest.approx(2 / (1 + 1))


# --- from records ------------------------------------------------------------------------------

def record(platform, stage, mb, ga, status="ok", **metrics):
    return schema_valid({"schema_version": "1.0", "run_id": f"{platform}-z{stage}-mb{mb}-ga{ga}", "kind": "training",
            "benchmark": "llama-tiny", "platform": platform, "status": status,
            "reason": None if status == "ok" else "CUDA out of memory",
            "config": {"workload": {"micro_batch_size": mb, "grad_acc_steps": ga}, "zero": {"stage": stage}},
            "overrides": [], "environment": {}, "microsteps": [],
            "metrics": {k: {"value": v, "unit": "%" if k == "mfu_pct" else "samples/s"}
                        for k, v in metrics.items()} if status == "ok" else {}})


@pytest.fixture
def record_dir(tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    recs = [record("p1", 1, 2, 4, samples_per_s=20.0, mfu_pct=40.0),
            record("p2", 1, 2, 4, samples_per_s=30.0, mfu_pct=20.0),
            record("p1", 2, 4, 2, samples_per_s=10.0, mfu_pct=20.0),
            record("p2", 2, 4, 2, status="oom")]
    for r in recs:
        (d / f"{r['run_id']}.json").write_text(json.dumps(r), encoding="utf-8")
    (d / "suite.json").write_text(json.dumps({"suite": "x"}), encoding="utf-8")   # not a record: skipped
    return d


def run_cli(capsys, *args):
    code = cli(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_records_both_kinds_json(capsys, record_dir):
    code, out, _ = run_cli(capsys, "--records", str(record_dir), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["benchmark"] == "llama-tiny" and "Pennycook" in doc["citation"]
    pp = {(s["kind"], r["application"]): r["pp"] for s in doc["sections"] for r in s["results"]}
    assert pp[("application", "z1-mb2-ga4")] == pytest.approx(2 / (1 + 1))        # best on both
    assert pp[("application", "z2-mb4-ga2")] == 0.0                              # oom on p2
    assert pp[("architectural", "z1-mb2-ga4")] == pytest.approx(2 / (1 / 0.4 + 1 / 0.2))
    assert pp[("architectural", "z2-mb4-ga2")] == 0.0


def test_cli_default_table_names_oom_and_notes_missing_mfu(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "--references", str(write_refs(tmp_path, FIXTURE)))
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["baseline"][-1] == f"{BASELINE_PP:.3f}" == "0.693"
    assert rows["tuned"][-1] == "1.000"
    assert "OOM" in rows["z2-mb256-ga1"] and rows["z2-mb256-ga1"][-1] == "0.000"
    assert "no mfu_pct data for llama-8b-kd" in out


@pytest.mark.parametrize("args, message", [
    (["--platforms", "ib-a100,h200"], "no samples_per_s data for llama-8b-kd on h200"),
    (["--kind", "architectural"], "no mfu_pct data"),
    (["--benchmark", "llama-70b"], "llama-70b"),
    (["--kind", "fastest"], "invalid choice"),
    (["--metric", "samples_per_sec"], "--metric samples_per_sec: no result of llama-8b-kd has it; its metrics: samples_per_s"),
])
def test_cli_bad_input_exits_2(capsys, tmp_path, args, message):
    code, _, err = run_cli(capsys, "--references", str(write_refs(tmp_path, FIXTURE)), *args)
    assert code == 2 and message in err


def test_cli_record_that_is_not_json_exits_2(capsys, tmp_path):
    bad = tmp_path / "run.json"
    bad.write_text("Traceback (most recent call last):\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "--records", str(bad))
    assert code == 2 and "run.json" in err and "not a JSON result record" in err


# --- the published figures in reference_results/ -----------------------------------------------

def test_published_model2_from_reference_results(capsys):
    refs = [r for r in load_references() if r.benchmark == "llama-8b-kd" and r.metric == "samples_per_s"]
    if not refs:
        pytest.skip(f"no llama-8b-kd samples_per_s references in {REFERENCE_DIR} yet")
    res = by_app(portability(observations_from_references(refs, "llama-8b-kd"), "samples_per_s",
                             "application", PLATFORMS))
    assert res["tuned"].pp == pytest.approx(1.0)
    assert res["baseline"].pp == pytest.approx(BASELINE_PP, rel=1e-9)
    # step 2: ZeRO-1 with micro-batch 64 is the published baseline (66.78 on ib-a100 in this table)
    assert res["z1-mb64-ga4"].pp == pytest.approx(3 / (90.71 / 66.78 + 79.9 / 58.51 + 146.37 / 92.35))
    assert res["z2-mb128-ga2"].pp == pytest.approx(Z2_MB128_PP, rel=1e-9)
    assert res["z1-mb128-ga2"].pp == 0.0 and res["z2-mb256-ga1"].pp == 0.0     # published OOM cells
    code, out, _ = run_cli(capsys)
    assert code == 0 and "baseline" in out and "0.693" in out


def test_the_command_line_prints_the_published_baseline_and_tuned_portability():
    import json as _json
    import subprocess
    import sys

    from harness.config.schema import REPO_ROOT

    proc = subprocess.run([sys.executable, "-m", "harness", "portability", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    results = {r["application"]: r["pp"] for section in _json.loads(proc.stdout)["sections"]
               if section["kind"] == "application" for r in section["results"]}
    expected_baseline = 3 / (90.71 / 65.78 + 79.9 / 58.51 + 146.37 / 92.35)
    assert results["baseline"] == pytest.approx(expected_baseline, rel=1e-12)
    assert results["tuned"] == pytest.approx(1.0)


def test_a_compiled_run_is_its_own_application_never_pooled_with_the_eager_run_of_its_split(capsys, tmp_path):
    """Records of two GPUs where one also ran the split compiled: the eager row pairs the two eager runs, the
    compiled run is a row of its own (no data on the other GPU, PP 0), and it is the best known on its GPU
    (application efficiency is against the best implementation there). It used to take the compiled run's
    1,265 samples/s as the H100's eager z1-mb128-ga8 beside the H200's eager 797."""
    recs = [record("h100", 1, 128, 8, samples_per_s=716.3), record("h200", 1, 128, 8, samples_per_s=797.2),
            record("h100", 1, 128, 8, samples_per_s=1264.92)]
    recs[2]["config"]["workload"].update(compile="torch", kernels="eager", precision="bf16", attention="auto")
    recs[2]["run_id"] += "-compile"
    for r in recs:
        (tmp_path / f"{r['run_id']}.json").write_text(json.dumps(r), encoding="utf-8")
    code, out, _ = run_cli(capsys, "--records", str(tmp_path), "--kind", "application")
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert rows["z1-mb128-ga8"].split() == ["z1-mb128-ga8", "716.3", "(0.566)", "797.2", "(1.000)", "0.723"]
    assert rows["z1-mb128-ga8-torch"].split() == ["z1-mb128-ga8-torch", "1,265", "(1.000)", "no", "data", "0.000"]
    assert "then the training stack where it is not eager" in out
    assert rows["best"].split()[2:] == ["1,265", "z1-mb128-ga8-torch", "797.2", "z1-mb128-ga8"]
