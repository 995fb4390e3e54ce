"""Submissions (harness.verdict.submit): records -> reference_results/<platform>.json, all-or-nothing.

Every test works on a fake reference folder under tmp_path; the real reference_results/ is never touched.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import harness.verdict.submit as submit_mod
from harness.verdict.references import validate_reference_file
from harness.verdict.submit import SubmissionRejected, cli, submit

TODAY = "2026-11-22"
EXISTING = {  # an unrelated entry that must survive every submission unchanged
    "platform": "cpu", "benchmark": "all_reduce", "config": {"nodes": 1, "num_ranks": 2}, "metric": "avg_busbw_gbps",
    "value": 0.18, "unit": "GB/s", "direction": "higher", "tolerance_pct": 50.0, "status": "ok", "samples": [0.18],
    "num_samples": 1, "provenance": {"source": "earlier", "submitter": "someone", "date": "2026-11-21",
                                     "system": "vm", "environment": None, "suite_commit": None, "note": None}}


def training_record(run_id="r0", samples_per_s=20.0, stage=1, platform="cpu", device="cpu"):
    """A minimal valid training record of the cpu platform (llama-tiny, mb 2 x ga 4)."""
    return {
        "schema_version": "1.0", "run_id": run_id, "kind": "training", "benchmark": "llama-tiny",
        "platform": platform, "status": "ok", "reason": None,
        "config": {"platform": {"name": platform, "description": "2 processes on one CPU host", "device": device,
                                "nodes": 1},
                   "workload": {"micro_batch_size": 2, "grad_acc_steps": 4, "seq_len": 128, "precision": "fp32"},
                   "zero": {"stage": stage, "overlap_comm": None}},
        "overrides": ["platform=cpu"],
        "environment": {"python": "3.11.7", "torch": "2.13.0+cpu", "deepspeed": "0.19.8", "transformers": "5.23.0",
                        "cuda": None, "nccl": None, "driver": None, "gpu_model": None, "gpu_count": 0,
                        "container_image": None, "env": {"OMP_NUM_THREADS": "1"}, "hosts": ["vm"],
                        "suite_commit": "ce6a917", "num_ranks": 2,
                        "machine": {"cpu": {"model": "AMD EPYC", "logical_cpus": 2, "mem_total_gib": 23.5}}},
        "metrics": {"samples_per_s": {"value": samples_per_s, "unit": "samples/s", "mode": "throughput"},
                    "tokens_per_s": {"value": samples_per_s * 128, "unit": "tokens/s", "mode": "throughput"},
                    "step_time_s": {"value": 16 / samples_per_s, "unit": "s", "mode": "throughput", "p10": 0.7},
                    "peak_mem_gib": {"value": 0.68, "unit": "GiB", "mode": "throughput"},
                    "mfu_pct": {"value": 32.8, "unit": "%", "mode": "throughput"},
                    "final_loss": {"value": 7.04, "unit": "nats", "mode": "throughput"}},
        "microsteps": [],
    }


def write_records(folder: Path, records) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rec in records:
        name = rec["run_id"] if isinstance(rec, dict) and isinstance(rec.get("run_id"), str) else f"x{id(rec)}"
        (folder / f"{name}.json").write_text(json.dumps(rec), encoding="utf-8")  # NaN/Infinity tokens kept
    (folder / "suite.json").write_text(json.dumps({"suite": "default-cpu", "runs": []}), encoding="utf-8")
    return folder


def three(samples=(10.0, 30.0, 20.0), prefix="r", **kw):
    return [training_record(f"{prefix}{i}", v, **kw) for i, v in enumerate(samples)]


def ref_dir_with_existing(root: Path) -> Path:
    ref = root / "refs"
    ref.mkdir()
    (ref / "cpu.json").write_text(json.dumps({"schema_version": "1.0", "description": "cpu", "references": [EXISTING]},
                                             indent=1), encoding="utf-8")
    return ref


def snapshot(folder: Path) -> dict[str, str]:
    """Hash of every file; the lock file may appear (empty) once a submission got as far as the lock."""
    lock = folder / submit_mod.LOCK_NAME
    assert not lock.exists() or lock.read_bytes() == b""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p != lock}


def run(results, ref, **kw):
    return submit([results], reference_dir=ref, today=TODAY, submitter="tester", **kw)


@pytest.fixture
def ref(tmp_path):
    return ref_dir_with_existing(tmp_path)


def entries(ref: Path, name="cpu.json"):
    return json.loads((ref / name).read_text())["references"]


def test_three_repeats_become_references_with_median_samples_and_provenance(tmp_path, ref):
    changes = run(write_records(tmp_path / "res", three()), ref)
    data = json.loads((ref / "cpu.json").read_text())
    assert validate_reference_file(data) == []
    assert data["references"][0] == EXISTING
    by_metric = {e["metric"]: e for e in data["references"][1:]}
    assert sorted(by_metric) == ["mfu_pct", "peak_mem_gib", "samples_per_s", "step_time_s", "tokens_per_s"]
    sps = by_metric["samples_per_s"]
    assert (sps["value"], sps["samples"], sps["num_samples"], sps["unit"]) == (20.0, [10.0, 30.0, 20.0], 3, "samples/s")
    assert sps["config"] == {"nodes": 1, "num_ranks": 2, "zero_stage": 1, "micro_batch_size": 2, "grad_acc_steps": 4,
                             "seq_len": 128, "precision": "fp32",
                             "activation_checkpointing": False}  # absent from the record: it ran without
    assert (sps["tolerance_pct"], by_metric["peak_mem_gib"]["tolerance_pct"]) == (25.0, 10.0)  # cpu tolerances
    prov = sps["provenance"]
    assert (prov["source"], prov["submitter"], prov["date"], prov["system"], prov["suite_commit"]) == (
        "suite submission", "tester", TODAY, "2 processes on one CPU host", "ce6a917")
    assert prov["environment"]["hosts"] == ["vm"] and "r0, r1, r2" in prov["note"]
    assert [c.action for c in changes] == ["added"] * 5


def test_missing_file_is_created_and_gpu_platforms_get_the_default_tolerances(tmp_path):
    ref = tmp_path / "refs"
    recs = three(platform="h200", device="cuda")
    for r in recs:
        r["environment"].update(cuda="12.8", nccl="2.27.3", driver="570.1", gpu_model="NVIDIA H200",
                                hardware_mismatch=[])
    run(write_records(tmp_path / "res", recs), ref, system="8x H200 SXM, one node")
    data = json.loads((ref / "h200.json").read_text())
    assert data["schema_version"] == "1.0" and data["description"]
    tol = {e["metric"]: e["tolerance_pct"] for e in data["references"]}
    assert tol == {"samples_per_s": 10.0, "tokens_per_s": 10.0, "step_time_s": 10.0, "peak_mem_gib": 5.0,
                   "mfu_pct": 10.0}
    assert {e["provenance"]["system"] for e in data["references"]} == {"8x H200 SXM, one node"}


def _set(path, value):
    def mutate(rec):
        *parents, last = path
        for key in parents:
            rec = rec[key]
        rec[last] = value
    return mutate


# (name, mutation of one record of three, a reason that must be listed)
REJECTIONS = [
    ("schema", lambda r: r.pop("run_id"), "schema: <root>: 'run_id' is a required property"),
    ("status oom", lambda r: r.update(status="oom", reason="CUDA out of memory"), "status 'oom'"),
    ("missing fingerprint", _set(("environment", "torch"), None), "environment.torch is None"),
    ("empty hosts", _set(("environment", "hosts"), []), "environment.hosts is []"),
    ("machine unknown", _set(("environment", "machine"), {"cpu": {"model": "x86_64"}}),
     "environment.machine does not name the hardware"),
    ("cuda fingerprint", _set(("config", "platform", "device"), "cuda"), "environment.nccl is None"),
    ("wrong unit", _set(("metrics", "samples_per_s", "unit"), "samples/min"),
     "metrics.samples_per_s.unit is 'samples/min', expected 'samples/s'"),
    ("nan", _set(("metrics", "step_time_s", "value"), math.nan), "not finite: metrics/step_time_s/value = nan"),
    ("infinity", _set(("metrics", "step_time_s", "p10"), math.inf), "not finite: metrics/step_time_s/p10 = inf"),
    ("infinity outside metrics", _set(("environment", "extra"), math.inf), "not finite: environment/extra = inf"),
    ("unknown platform", lambda r: r.update(platform="moon-x1"), "unknown platform 'moon-x1'"),
    ("out of bounds", _set(("metrics", "mfu_pct", "value"), 150.0), "metrics.mfu_pct = 150.0 is out of bounds"),
    ("zero throughput", _set(("metrics", "samples_per_s", "value"), 0), "metrics.samples_per_s = 0 is out of bounds"),
    ("mixed platforms", lambda r: r.update(platform="h200"), "platforms (cpu, h200"),
    ("too few repeats", lambda r: r["config"]["zero"].update(stage=2), "1 run(s) (" ),
    ("wrong kind", lambda r: r.update(kind="inference"), "kind 'inference'"),
    ("config without key", lambda r: r["config"].pop("workload"), "config lacks what identifies the configuration"),
]


@pytest.mark.parametrize("name,mutate,expected", REJECTIONS, ids=[c[0] for c in REJECTIONS])
def test_each_rejection_reason_is_listed_and_nothing_changes(tmp_path, ref, name, mutate, expected):
    recs = three()
    mutate(recs[1])
    before = snapshot(ref)
    with pytest.raises(SubmissionRejected) as exc:
        run(write_records(tmp_path / "res", recs), ref)
    assert any(expected in reason for reason in exc.value.reasons), exc.value.reasons
    assert snapshot(ref) == before


def test_all_reasons_are_listed_at_once(tmp_path, ref):
    recs = []
    for i, (_, mutate, _) in enumerate(REJECTIONS):
        rec = training_record(f"m{i:02d}", 20.0 + i)
        mutate(rec)
        recs.append(rec)
    folder = write_records(tmp_path / "res", recs)
    (folder / "broken.json").write_text("{", encoding="utf-8")
    before = snapshot(ref)
    with pytest.raises(SubmissionRejected) as exc:
        run(folder, ref)
    text = str(exc.value)
    assert text.startswith("submission rejected:\n")
    for _, _, expected in REJECTIONS:
        assert expected in text
    assert "broken.json: not a readable JSON file" in text
    assert snapshot(ref) == before


def test_no_records_and_no_system_description_are_rejected(tmp_path, ref):
    with pytest.raises(SubmissionRejected, match="no result records"):
        run(write_records(tmp_path / "empty", []), ref)
    recs = three()
    for r in recs:
        r["config"]["platform"]["description"] = ""
    with pytest.raises(SubmissionRejected, match="no system description"):
        run(write_records(tmp_path / "res", recs), ref)
    run(write_records(tmp_path / "res", recs), ref, system="my laptop")  # --system fills it
    assert entries(ref)[1]["provenance"]["system"] == "my laptop"


def test_min_repeats_is_configurable(tmp_path, ref):
    folder = write_records(tmp_path / "res", three()[:2])
    with pytest.raises(SubmissionRejected, match=r"2 run\(s\) .*at least 3 needed"):
        run(folder, ref)
    assert [c.action for c in run(folder, ref, min_repeats=2)] == ["added"] * 5


def test_overwrite_needs_replace_with_a_reason_and_keeps_it(tmp_path, ref):
    run(write_records(tmp_path / "a", three()), ref)
    second = write_records(tmp_path / "b", three((40.0, 50.0, 60.0), prefix="s"))
    before = snapshot(ref)
    with pytest.raises(SubmissionRejected, match="--replace") as exc:
        run(second, ref)
    (line,) = exc.value.reasons  # one per configuration, naming its metrics
    assert line.endswith(" (samples_per_s, tokens_per_s, step_time_s, peak_mem_gib, mfu_pct); pass --replace "
                         "--reason '...' to replace them"), line
    with pytest.raises(SubmissionRejected, match="--replace needs --reason"):
        run(second, ref, replace=True)
    with pytest.raises(SubmissionRejected, match="--replace needs --reason"):
        run(second, ref, replace=True, reason="  ")
    assert snapshot(ref) == before
    changes = run(second, ref, replace=True, reason="new BIOS settings")
    assert [c.action for c in changes] == ["replaced"] * 5
    data = entries(ref)
    assert len(data) == 6 and data[0] == EXISTING
    sps = next(e for e in data if e["metric"] == "samples_per_s")
    assert (sps["value"], sps["samples"]) == (50.0, [40.0, 50.0, 60.0])
    note = sps["provenance"]["note"]
    assert "replaces 20.0 samples/s (samples [10.0, 30.0, 20.0]) from suite submission, 2026-11-22" in note
    assert note.endswith(": new BIOS settings")


def test_invalid_target_file_is_rejected_untouched(tmp_path, ref):
    (ref / "cpu.json").write_text('{"schema_version": "1.0", "references": [{"platform": "cpu"}]}')
    before = snapshot(ref)
    with pytest.raises(SubmissionRejected, match="invalid reference file"):
        run(write_records(tmp_path / "res", three()), ref)
    assert snapshot(ref) == before


def test_cli_reports_rejection_with_exit_2_and_additions_with_exit_0(tmp_path, ref, capsys):
    target = ref / "cpu.json"
    bad = three()
    bad[0]["status"] = "timeout"
    bad[0]["reason"] = "ran past 600 s"
    bad[1]["metrics"]["peak_mem_gib"]["unit"] = "GB"
    before = snapshot(ref)
    assert cli([str(write_records(tmp_path / "bad", bad)), "--reference-file", str(target), "--submitter", "t"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: submission rejected:"
    assert any("status 'timeout'" in line for line in err) and any("expected 'GiB'" in line for line in err)
    assert snapshot(ref) == before
    assert cli([str(write_records(tmp_path / "good", three())), "--reference-file", str(target),
                "--submitter", "t"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [" ".join(line.split()) for line in out if line.startswith("added ")]
    assert len(rows) == 5 and all(row.startswith("added c1 ") for row in rows)
    assert "added c1 samples_per_s 20.000 samples/s 3" in rows and "  c1  cpu/llama-tiny ZeRO-" in "\n".join(out)
    assert cli(["--min-repeats", "x", str(tmp_path)]) == 2


def test_concurrent_submissions_lose_nothing(tmp_path, ref, monkeypatch):
    real_read = submit_mod._read_reference_file

    def slow_read(path, platform):  # widen the read-modify-write window: without the lock one write is lost
        data = real_read(path, platform)
        time.sleep(0.3)
        return data

    monkeypatch.setattr(submit_mod, "_read_reference_file", slow_read)
    folders = [write_records(tmp_path / f"res{s}", three(prefix=f"z{s}-", stage=s)) for s in (1, 3)]
    barrier, errors = threading.Barrier(2), []

    def go(folder):
        barrier.wait()
        try:
            run(folder, ref)
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(f,)) for f in folders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    data = entries(ref)
    assert sorted(e["config"].get("zero_stage", 0) for e in data) == [0] + [1] * 5 + [3] * 5


# --- property-based: mutated records never crash the submission, and a rejection writes nothing ---

def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(training_record()) if p]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
MUTATION = st.tuples(st.sampled_from(["delete", "set", "add"]), st.sampled_from(PATHS), JSON_VALUES,
                     st.text(max_size=6))


def _apply(rec, mutation):
    action, path, value, new_key = mutation
    parent = rec
    for key in path[:-1]:
        try:
            parent = parent[key]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    if isinstance(parent, dict) and action == "add":
        parent[new_key] = value
    elif isinstance(parent, dict) and last in parent or isinstance(parent, list) and isinstance(last, int) \
            and last < len(parent):
        if action == "delete":
            del parent[last]
        else:
            parent[last] = value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(st.tuples(st.integers(0, 2), MUTATION), min_size=1, max_size=4))
@example(mutations=[(0, ("add", ("environment", "python"), math.inf, ""))])  # once crashed the write
def test_fuzzed_records_are_accepted_or_rejected_with_reasons_never_crash(mutations):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ref = ref_dir_with_existing(root)
        recs = [copy.deepcopy(r) for r in three()]
        for index, mutation in mutations:
            _apply(recs[index], mutation)
        folder = write_records(root / "res", recs)
        before = snapshot(ref)
        try:
            changes = run(folder, ref)
        except SubmissionRejected as exc:
            assert exc.reasons and all(isinstance(r, str) and r for r in exc.reasons)
            assert snapshot(ref) == before
        else:
            assert changes
            assert validate_reference_file(json.loads((ref / "cpu.json").read_text())) == []


@pytest.mark.parametrize("mismatch,words", [
    (["platform h200 declares H200-SXM-141GB (bf16 peak 989.4 TFLOP/s, used for MFU), the ranks ran on 'NVIDIA H100 PCIe'"],
     "hardware: platform h200 declares H200-SXM-141GB"),
    (None, "environment.hardware_mismatch is missing")])
def test_a_gpu_record_of_other_hardware_than_declared_is_refused(tmp_path, mismatch, words):
    recs = three(platform="h200", device="cuda")
    for r in recs:
        r["environment"].update(cuda="12.8", nccl="2.27.3", driver="570.1", gpu_model="NVIDIA H100 PCIe",
                                hardware_mismatch=mismatch)
    with pytest.raises(SubmissionRejected) as exc:
        run(write_records(tmp_path / "res", recs), tmp_path / "refs", system="x")
    assert words in str(exc.value)
    assert not (tmp_path / "refs" / "h200.json").exists()


# --- a wrong suite commit in the records: given at submission, the records left as they are -------

def this_head():
    from harness.config.schema import REPO_ROOT
    from harness.record import suite_commit

    if suite_commit().startswith("content:"):
        pytest.skip("this suite is a copy, not a checkout: --suite-commit cannot be checked here")
    return subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_given_suite_commit_goes_into_the_provenance_with_what_the_records_said_and_why(tmp_path, ref, capsys):
    """The H100 records of 2026-11-27 name 2a7ad1e6... (the repository their copy of the suite sat in):
    the table carries the suite's commit, the records' value and the reason; the records stay as they are."""
    head = this_head()
    results = write_records(tmp_path / "res", three())
    before = snapshot(results)
    why = "a git archive copy of the suite inside another repository recorded that repository's commit"
    assert cli([str(results), "--reference-file", str(ref / "cpu.json"), "--submitter", "t",
                "--suite-commit", head[:12], "--why", why]) == 0
    assert f"suite_commit: {head} as given (--suite-commit), not the records' ce6a917" in capsys.readouterr().out
    new = entries(ref)[1:]
    assert new and all(e["provenance"]["suite_commit"] == head and e["provenance"]["environment"]["suite_commit"] == head
                       and e["provenance"]["suite_commit_given"] == {"recorded": "ce6a917", "why": why} for e in new)
    assert validate_reference_file(json.loads((ref / "cpu.json").read_text())) == []
    assert snapshot(results) == before, "the records are never edited"
    # without the option nothing is given, and the entry does not carry the field at all
    run(write_records(tmp_path / "other", three(stage=2)), ref)
    plain = [e for e in entries(ref) if e["config"].get("zero_stage") == 2]
    assert plain and all("suite_commit_given" not in e["provenance"] and e["provenance"]["suite_commit"] == "ce6a917"
                         for e in plain)


@pytest.mark.parametrize("sha,why,expected", [
    ("0" * 40, "x", "not a commit of this suite's history"),
    ("main", "x", "not a commit id"),
    ("HEAD~1", "x", "not a commit id"),
    (None, None, "needs --why"),   # None: this checkout's HEAD, which is a commit
    (None, "  ", "needs --why"),
])
def test_a_given_suite_commit_that_is_not_one_of_the_suites_or_has_no_reason_is_refused(tmp_path, ref, sha, why,
                                                                                        expected):
    sha = sha or this_head()
    before = snapshot(ref)
    with pytest.raises(SubmissionRejected, match=re.escape(expected)):
        run(write_records(tmp_path / "res", three()), ref, suite_commit=sha, why=why)
    assert snapshot(ref) == before


def test_a_suite_commit_cannot_be_checked_from_a_copy_of_the_suite(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "__init__.py").write_text("")
    full, why = submit_mod.history_commit("b8fea445d815", root=tmp_path)
    assert full is None and "not a git checkout (its files hash to content:sha256:" in why


def test_why_without_a_suite_commit_warns_that_it_has_no_effect(tmp_path, ref):
    with pytest.warns(UserWarning, match="--why has no effect without --suite-commit"):
        run(write_records(tmp_path / "res", three()), ref, why="no reason to give")


def test_a_nightly_folder_whose_records_lie_in_its_repeats_says_that_alone(tmp_path, ref):
    """Found submitting a nightly's OUT: besides "records lie in its subfolders", the rejection also asked for a
    system description, which records it had not read could not have given."""
    night = tmp_path / "night"
    write_records(night / "repeat-0", three())
    with pytest.raises(SubmissionRejected) as exc:
        run(night, ref)
    assert exc.value.reasons == [f"no result records in {night} (records lie in its subfolders: {night / 'repeat-0'}; "
                                 "name them)"]
