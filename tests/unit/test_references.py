"""Reference tables: the published figures carried exactly, the suite's own cpu references, the format."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.verdict.references import (REFERENCE_DIR, load_file, load_references, references_from_records, select,
                                validate_reference_file)
from unit_helpers import typed

SOURCES = REFERENCE_DIR / "sources" / "sc25-pmbs"


def converter():
    spec = importlib.util.spec_from_file_location("to_references", SOURCES / "to_references.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_published_file_is_exactly_what_the_sources_give():
    stored = json.loads((REFERENCE_DIR / "sc25-pmbs.json").read_text(encoding="utf-8"))["references"]
    assert stored == json.loads(json.dumps(converter().build()))


def test_the_copied_sources_are_the_shared_paper_files():
    shared = Path(__file__).resolve().parents[3] / "shared" / "paper"
    if not shared.is_dir():
        pytest.skip("../shared/paper is not beside this checkout")
    for path in sorted(shared.glob("*.csv")):
        assert (SOURCES / path.name).read_bytes() == path.read_bytes(), path.name


def published_cells():
    """(platform, benchmark, metric, config subset, text as published or None for OOM)."""
    for r in csv.DictReader(open(SOURCES / "model2_step2_parallelism.csv")):
        cfg = {"zero_stage": int(r["zero_stage"]), "micro_batch_size": int(r["batch_size"]),
               "grad_acc_steps": int(r["grad_acc"])}
        yield r["platform"], "llama-8b-kd", "samples_per_s", cfg, r["samples_per_s"] or None
    for r in csv.DictReader(open(SOURCES / "model2_step3_tuned.csv")):
        yield r["platform"], "llama-8b-kd", "samples_per_s", {"tuning": "baseline"}, r["baseline_samples_per_s"]
        yield r["platform"], "llama-8b-kd", "samples_per_s", {"tuning": "tuned"}, r["tuned_samples_per_s"]
    for r in csv.DictReader(open(SOURCES / "model1_ib-a100_batch_time.csv")):
        cfg = {"zero_stage": int(r["zero_stage"]), "micro_batch_size": int(r["batch_size"])}
        yield r["platform"], "llama-440m", "batch_time_s", cfg, r["batch_time_s"] or None
        yield r["platform"], "llama-440m", "estimated_hours", cfg, r["estimated_hours"] or None
    for r in csv.DictReader(open(SOURCES / "model1_ib-a100_microsteps.csv")):
        cfg = {"zero_stage": int(r["zero_stage"]), "microstep": int(r["microstep"])}
        for column in ("total", "computation", "communication"):
            yield r["platform"], "llama-440m", f"microstep_{column}_ms", cfg, r[column]
    for r in csv.DictReader(open(SOURCES / "model1_ib-a100_stage1_phases.csv")):
        cfg = {"micro_batch_size": int(r["batch_size"])}
        for column in ("gradient_computation", "gradient_all_reduce", "optimizer_all_gather"):
            yield r["platform"], "llama-440m", f"{column}_ms", cfg, r[column]


def test_every_published_cell_is_a_reference_with_its_exact_value_and_oom_as_oom():
    refs = load_references([REFERENCE_DIR / "sc25-pmbs.json"])
    cells = list(published_cells())
    assert len(cells) == len(refs) == 107
    for platform, benchmark, metric, cfg, text in cells:
        (ref,) = select(refs, platform=platform, benchmark=benchmark, metric=metric, config=cfg)
        if text is None:
            assert ref.status == "oom" and ref.value is None and ref.samples == ()
        else:
            assert ref.status == "ok" and ref.value == float(text) and ref.samples == (float(text),)
        assert ref.provenance.date == "2025-11-17" and "SC'25 PMBS" in ref.provenance.source
        assert ref.provenance.system


def test_the_two_published_ib_a100_baselines_are_both_kept():
    refs = load_references([REFERENCE_DIR / "sc25-pmbs.json"])
    step2 = select(refs, platform="ib-a100", config={"zero_stage": 1, "micro_batch_size": 64, "grad_acc_steps": 4})
    step3 = select(refs, platform="ib-a100", config={"tuning": "baseline"})
    assert [r.value for r in step2] == [66.78] and [r.value for r in step3] == [65.78]


def test_the_cpu_references_come_from_this_suite_with_their_fingerprint():
    refs = load_references([REFERENCE_DIR / "cpu.json"])
    assert {r.platform for r in refs} == {"cpu"}
    assert {"llama-tiny", "all_reduce"} <= {r.benchmark for r in refs}
    for ref in refs:
        assert ref.status == "ok" and ref.num_samples >= 1
        assert ref.provenance.environment["torch"].startswith("2.13.0")
        assert ref.provenance.suite_commit
        probe = ref.provenance.environment["machine"]["probe"]   # issue 26: the machine, measured
        assert probe["matmul"]["fp32"]["best"] > 0 and probe["isa"]["class"], ref.key()
        samples = sorted(ref.samples)
        assert samples[0] <= ref.value <= samples[-1]
    zero_stages = {r.config["zero_stage"] for r in refs if r.benchmark == "llama-tiny"}
    assert zero_stages == {1, 2, 3}


def good_entry(**changes):
    entry = {"platform": "cpu", "benchmark": "llama-tiny", "config": {"zero_stage": 1},
             "metric": "samples_per_s", "value": 10.0, "unit": "samples/s", "direction": "higher",
             "tolerance_pct": 5.0, "status": "ok", "num_samples": 2, "samples": [9.0, 11.0],
             "provenance": {"source": "s", "submitter": "me", "date": "2026-01-01", "system": "x",
                            "environment": None, "suite_commit": None, "note": None}}
    entry.update(changes)
    return entry


@pytest.mark.parametrize("entries,fragment", [
    ([good_entry(value=None)], "value"),
    ([good_entry(status="oom", value=3.0)], "value"),
    ([good_entry(direction="up")], "direction"),
    ([good_entry(num_samples=3)], "num_samples=3 but 2 samples"),
    ([good_entry(), good_entry()], "same platform, benchmark, config, metric and machine"),
    ([{k: v for k, v in good_entry().items() if k != "provenance"}], "provenance"),
    ([good_entry(provenance={"source": "s"})], "submitter"),
])
def test_a_bad_reference_file_is_refused_with_its_reasons(tmp_path, entries, fragment):
    doc = {"schema_version": "1.0", "references": entries}
    assert any(fragment in p for p in validate_reference_file(doc)), validate_reference_file(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(HarnessError, match="invalid reference file"):
        load_file(path)


def test_references_from_repeated_records_take_the_median_and_keep_every_sample():
    def record(run_id, sps):
        return {"run_id": run_id, "kind": "training", "status": "ok", "platform": "cpu",
                "benchmark": "llama-tiny",
                "config": {"platform": {"nodes": 1}, "zero": {"stage": 2, "overlap_comm": None},
                           "workload": {"micro_batch_size": 2, "grad_acc_steps": 4, "seq_len": 128,
                                        "precision": "fp32"}},
                "environment": {"num_ranks": 2, "suite_commit": "abc", "torch": "2.13.0"},
                "metrics": {"samples_per_s": {"value": sps, "unit": "samples/s"}}}
    recs = [record("a", 10.0), record("b", 14.0), record("c", 11.0), {**record("d", 99.0), "status": "oom"}]
    (ref,) = references_from_records(typed(recs), source="suite", submitter="me", date="2026-11-21", system="x",
                                     tolerance_pct={"default": 20.0})
    assert ref.value == 11.0 and sorted(ref.samples) == [10.0, 11.0, 14.0]
    assert ref.config["zero_stage"] == 2 and "zero" not in ref.config  # unset knobs are not part of the key
    assert ref.tolerance_pct == 20.0 and ref.provenance.suite_commit == "abc"


def test_every_run_of_the_default_cpu_suite_has_cpu_references():
    """`make bench` on a laptop is judged, not only listed as new: each training run's configuration
    key (distillation settings included) matches references in cpu.json."""
    from harness.bench import plan_suite
    from harness.verdict.compare import Group, matches
    from harness.verdict.references import record_config

    refs = load_references([REFERENCE_DIR / "cpu.json"])
    _, planned = plan_suite([])
    for p in planned:
        kind = p.cfg.kind.value
        rec = {"config": p.run.config, "environment": {"num_ranks": p.run.num_ranks}, "kind": kind,
               "source": "builtin"}
        benchmarks = p.run.spec.ops if kind == "collective" else [p.cfg.workload.name]
        for benchmark in benchmarks:
            group = Group("cpu", benchmark, kind, record_config(typed([rec])[0]), [])
            found = {r.metric for r in refs if matches(r, group)}
            wanted = {"avg_busbw_gbps"} if kind == "collective" else {"samples_per_s", "peak_mem_gib", "mfu_pct"}
            assert wanted <= found, (p.run.run_id, benchmark, sorted(found))
    kd = [r for r in refs if r.benchmark == "llama-tiny-kd"]
    assert {r.metric for r in kd} >= {"samples_per_s", "mfu_with_teacher_pct"}
    assert all(r.config["distill"] == {"alpha": 0.5, "temperature": 2.0, "teacher": {"precision": "bf16"}} for r in kd)


def test_only_knobs_away_from_their_default_enter_the_key():
    from harness.verdict.references import record_config

    def key(**zero):
        rec = {"kind": "training", "environment": {"num_ranks": 2},
               "config": {"platform": {"nodes": 1}, "zero": {"stage": 1, **zero},
                          "workload": {"micro_batch_size": 2, "grad_acc_steps": 4, "seq_len": 128,
                                       "precision": "fp32"}}}
        return record_config(typed([rec])[0]).get("zero")

    assert key(gradient_collective="all_reduce", overlap_comm=None) is None  # as records made before the field
    assert key(gradient_collective="reduce_scatter") == {"gradient_collective": "reduce_scatter"}
    assert key(overlap_comm=False) == {"overlap_comm": False}


def test_a_workload_whose_shape_was_overridden_is_another_model_not_a_repeat_of_the_named_one():
    """Found on the first GPU records: llama-440m runs at 6, 12 and 24 layers were merged by submit
    into one reference of three 'repeats' (0.14, 0.39, 0.22 s) because the key left the shape out."""
    from harness.verdict.references import record_config

    def rec(run_id, step_s, **shape):
        workload = {"name": "llama-440m", "micro_batch_size": 8, "grad_acc_steps": 4, "seq_len": 128,
                    "precision": "bf16", "hidden_size": 1024, "num_layers": 24, "num_heads": 16, **shape}
        return {"kind": "training", "run_id": run_id, "platform": "h200", "benchmark": "llama-440m", "status": "ok",
                "environment": {"num_ranks": 1}, "metrics": {"step_time_s": {"value": step_s, "unit": "s"}},
                "config": {"platform": {"nodes": 1}, "zero": {"stage": 1}, "workload": workload}}

    named, six, twelve = typed([rec("a", 0.39), rec("b", 0.14, num_layers=6), rec("c", 0.22, num_layers=12)])
    assert "shape" not in record_config(named)          # the named workload's key is what it always was
    assert record_config(six)["shape"] == {"num_layers": 6}
    assert record_config(twelve)["shape"] == {"num_layers": 12}
    refs = references_from_records([named, six, twelve], source="t", submitter="t", date="2026-11-26", system="t",
                                   tolerance_pct={"default": 10.0})
    assert sorted(r.samples for r in refs if r.metric == "step_time_s") == [(0.14,), (0.22,), (0.39,)]
    # a workload with no conf/workload file (a record's own name) keys as it always did
    other = typed([rec("d", 0.5, name="not-a-workload", num_layers=6)])[0]
    assert "shape" not in record_config(other)
    # a distillation workload's shape comes from its defaults (llama-tiny-kd takes llama-tiny's)
    from harness.config.compose import compose
    from harness.verdict.references import SHAPE_FIELDS
    tiny = compose(["workload=llama-tiny"]).workload
    kd = {"name": "llama-tiny-kd", **{k: getattr(tiny, k) for k in SHAPE_FIELDS}}
    assert "shape" not in record_config(typed([rec("e", 0.5, **kd)])[0])
    assert record_config(typed([rec("f", 0.5, **{**kd, "num_layers": tiny.num_layers + 1})])[0])["shape"] == \
        {"num_layers": tiny.num_layers + 1}


# --- what the slides leave out: inferred, marked as such, and what a run must match ---------------

def test_what_the_slides_leave_out_is_inferred_marked_as_such_and_is_what_the_workloads_carry(composed):
    """seq_len and activation checkpointing (and Model 2's node count) are not in the slides: each
    entry carries the inferred value in its config and names it, with evidence, under provenance.inferred."""
    refs = load_references([REFERENCE_DIR / "sc25-pmbs.json"])
    inferred = {"llama-440m": {"seq_len", "activation_checkpointing"},
                "llama-8b-kd": {"seq_len", "activation_checkpointing", "nodes"}}
    for benchmark in inferred:
        w = composed([f"workload={benchmark}"]).workload
        mine = [r for r in refs if r.benchmark == benchmark]
        assert mine
        for ref in mine:
            assert ref.config["seq_len"] == w.seq_len == 128
            assert ref.config["activation_checkpointing"] is w.activation_checkpointing is (benchmark == "llama-8b-kd")
            assert ref.config["nodes"] == 2
            assert set(ref.provenance.inferred) == inferred[benchmark]
            assert all(v.startswith("INFERRED, not stated in the slides") and "infer_workloads.py" in v
                       for v in ref.provenance.inferred.values())


def planned_groups(overrides):
    """(run id, comparison group) of every training run a suite plans: the configuration key a
    record of the run would carry."""
    from harness.bench import plan_suite
    from harness.verdict.compare import Group
    from harness.verdict.references import record_config

    _, planned = plan_suite(overrides)
    out = []
    for p in planned:
        if p.cfg.kind.value != "training":
            continue
        rec = {"config": p.run.config, "environment": {"num_ranks": p.run.num_ranks}, "kind": "training"}
        out.append((p.run.run_id, Group(p.cfg.platform.name, p.cfg.workload.name, "training", record_config(typed([rec])[0]), [])))
    return out


@pytest.mark.parametrize("platform,suite,metric", [
    ("ib-a100", "paper-model1", "batch_time_s"),
    ("ib-a100", "paper-model2", "samples_per_s"),
    ("roce-h100", "paper-model2", "samples_per_s"),
])
def test_every_run_of_a_paper_suite_is_compared_with_exactly_its_published_cell(platform, suite, metric):
    from harness.verdict.compare import matches

    refs = load_references([REFERENCE_DIR / "sc25-pmbs.json"])
    cells = [r for r in refs if r.platform == platform and r.metric == metric and "tuning" not in r.config]
    seen = []
    for run_id, group in planned_groups([f"platform={platform}", f"suite={suite}"]):
        (ref,) = [r for r in cells if matches(r, group)]  # one published cell per run, OOM cells too
        assert (ref.config["zero_stage"], ref.config["micro_batch_size"]) == (
            group.config["zero_stage"], group.config["micro_batch_size"]), run_id
        seen.append(ref.key())
    assert sorted(seen) == sorted(r.key() for r in cells), "every published cell has its run"


@pytest.mark.parametrize("change", ["workload.seq_len=512", "workload.activation_checkpointing=false",
                                    "platform.nodes=1"])
def test_a_run_of_another_workload_than_the_one_measured_is_not_compared_with_the_published_figure(change):
    from harness.verdict.compare import matches

    refs = load_references([REFERENCE_DIR / "sc25-pmbs.json"])
    base = ["platform=ib-a100", "suite=single", "workload=llama-8b-kd", "zero=stage3", "workload.micro_batch_size=256"]
    extra = ["platform.launcher=local"] if change == "platform.nodes=1" else []
    ((_, same),) = planned_groups(base)
    ((_, other),) = planned_groups(base + [change] + extra)
    assert [r.value for r in refs if r.metric == "samples_per_s" and matches(r, same)] == [49.131]
    assert [r for r in refs if matches(r, other)] == []


def test_a_records_checkpointing_enters_its_key_and_is_off_when_the_record_predates_the_field():
    from harness.verdict.references import record_config

    def key(**workload):
        rec = {"kind": "training", "environment": {"num_ranks": 2},
               "config": {"platform": {"nodes": 1}, "zero": {"stage": 1},
                          "workload": {"micro_batch_size": 2, "grad_acc_steps": 4, "seq_len": 128,
                                       "precision": "fp32", **workload}}}
        return record_config(typed([rec])[0])["activation_checkpointing"]

    assert key() is False and key(activation_checkpointing=False) is False
    assert key(activation_checkpointing=True) is True


def test_inferred_fields_must_be_config_fields_and_are_optional():
    inferred = good_entry(provenance={**good_entry()["provenance"], "inferred": {"seq_len": "a fit"}})
    problems = validate_reference_file({"schema_version": "1.0", "references": [inferred]})
    assert problems == ["references/0: provenance.inferred names ['seq_len'], which the config does not have"]
    inferred["config"] = {**inferred["config"], "seq_len": 128}
    assert validate_reference_file({"schema_version": "1.0", "references": [inferred]}) == []
    from harness.verdict.references import Reference

    assert Reference.from_dict(inferred).to_dict() == inferred
    plain = good_entry()  # written before the field existed: valid, and written back without it
    assert validate_reference_file({"schema_version": "1.0", "references": [plain]}) == []
    assert Reference.from_dict(plain).to_dict() == plain


# --- the GPU nodes' tables: what `bench platform=<gpu> suite=gpu-check` is judged against ----------

NOT_MEASURED = {"z1-compile": "no H200 record of a compiled run at gpu-check's size",
                "z3-deepcompile": "DeepCompile's op could not be built on the H100 node (2026-11-27-h100-stack); the H200's "
                                  "record (2026-12-04-h200) measured across its step-5 passes and was not submitted",
                "kd": "no H100 record of llama-440m distilled from a teacher (the H200's: 2026-12-04-h200)"}
"""gpu-check's runs (by name) that a GPU has no record of yet: their verdict is `new` until one is submitted."""


@pytest.mark.parametrize("platform,unmeasured", [("h100", {"z3-deepcompile", "kd"}),
                                                 ("h200", {"z1-compile", "z3-deepcompile"})])
def test_every_measured_run_of_gpu_check_has_references_on_its_gpu(platform, unmeasured):
    """gpu-check on one H100 or H200 is judged, not only listed as new: each training run's configuration
    key matches references in <platform>.json, but the runs no node has measured (NOT_MEASURED); the
    one-rank nccl run is a smoke run (no bandwidth) and never has one."""
    from harness.verdict.compare import matches

    refs = load_references([REFERENCE_DIR / f"{platform}.json"])
    planned = [(run_id.partition("-")[2], group) for run_id, group in
               planned_groups([f"platform={platform}", "suite=gpu-check"])]
    assert unmeasured <= set(NOT_MEASURED) and {"z0", "z1", "z2", "z3"} <= {name for name, _ in planned}
    for name, group in planned:
        found = {r.metric for r in refs if matches(r, group)}
        if name in unmeasured:
            assert not found, f"{name} has references on {platform} now: take it out of the unmeasured runs"
        else:
            assert {"samples_per_s", "peak_mem_gib", "mfu_pct"} <= found, (platform, name, sorted(found))


def test_the_h100_references_name_the_suites_commit_not_the_repository_around_its_copy():
    """The H100 records of 2026-11-27 carry 2a7ad1e6... (the repository their git-archive copy of the suite
    sat in); the table carries the suite's commit, given at submission, with what the records said and why."""
    refs = load_references([REFERENCE_DIR / "h100.json"])
    given = [r for r in refs if r.provenance.suite_commit_given]
    assert {r.config["micro_batch_size"] for r in given} == {8, 32, 128}   # gpu-check and gpu-zero3-host
    for ref in refs:
        p = ref.provenance
        assert p.suite_commit == p.environment["suite_commit"] and not p.suite_commit.startswith("2a7ad1e6")
        assert p.environment["gpu_model"].startswith("NVIDIA H100") and p.environment["torch"].startswith("2.11.0")
    for ref in given:
        p = ref.provenance
        assert p.suite_commit == "b8fea445d815c3430288255a7a8458ea6682b53c"
        assert p.suite_commit_given["recorded"].startswith("2a7ad1e6") and "git archive" in p.suite_commit_given["why"]
    records = sorted((REFERENCE_DIR / "sources" / "gpu-runs" / "2026-11-27-h100").glob("*/0*.json"))
    assert len(records) == 15 and all(json.loads(f.read_text())["environment"]["suite_commit"].startswith("2a7ad1e6")
                                      for f in records), "the records stay as they were written"
