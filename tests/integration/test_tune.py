"""`python -m harness tune` for real on the cpu platform: two gloo ranks per trial, the tiny model,
every step, then the winner confirmed against the default in interleaved pairs (whatever the
verdict, which this box's noise decides); then a resume that reuses every finished trial and
reruns only the one whose record is missing; then the preset it installed, composed by `plan` as
`make bench` would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.record import validate_record

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "conf" / "suite" / "tuned-cpu-llama-tiny.yaml"
ARGS = ["tune.budget=2", "tune.stages=[1,2]", "tune.micro_batch_sizes=[2,4]", "tune.bucket_sizes=[300000,1200000]",
        "measure.steps=2", "measure.warmup_steps=1", "measure.profile_steps=1", "tune.collective_iters=3",
        "tune.confirm_repeats=2"]


def tune(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "tune", f"out={out}", *ARGS, *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)


@pytest.fixture
def preset_cleanup():
    existed = PRESET.read_bytes() if PRESET.exists() else None
    yield
    if existed is None:
        PRESET.unlink(missing_ok=True)
    else:
        PRESET.write_bytes(existed)


def test_tune_runs_three_steps_resumes_and_leaves_a_usable_preset(tmp_path, preset_cleanup):
    out = tmp_path / "tune"
    proc = tune(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = json.loads((out / "tune.json").read_text())
    assert state["baseline"]["status"] == "ok" and state["baseline"]["value"] > 0
    s1, s2, s3 = state["steps"]
    assert "gloo" in s1["note"] and s1["trials"][0]["value"] > 0  # the curves for the model
    searched = [t for t in s2["trials"] + s3["trials"] if t["status"] != "skipped"]
    assert len([t for t in s2["trials"] if t["status"] != "skipped"]) == 1  # budget 2 = the default + 1
    assert len([t for t in s3["trials"] if t["status"] != "skipped"]) == 2
    for t in searched:
        assert t["status"] == "ok", t
        assert t["prediction"]["samples_per_s"] > 0 and t["prediction"]["memory"]["fits"]
        assert t["parity"]["ok"] is True and t["parity"]["num_steps"] == 3, t["parity"]  # same numerics
        rec = json.loads((out / t["records"][0]).read_text())
        assert validate_record(rec) == [] and rec["overrides"] == t["overrides"]
    report = (out / "report.md").read_text()
    for text in ("What each step contributed", "Loss parity", "predicted samples/s", "Step 3"):
        assert text in report
    ds = json.loads((out / "best" / "deepspeed.json").read_text())
    assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] == 8
    c = state["confirmation"]  # the verdict is the box's: either is a valid outcome, each must be whole
    assert c["verdict"] in ("significant gain", "no significant gain", "default is best"), c
    if c["folder"]:
        assert c["order"] == ["default", "winner"] * 2 and len(c["default_samples_per_s"]) == 2
        assert len(c["winner_samples_per_s"]) == 2 and len(c["interval"]) == 2
        assert all(validate_record(json.loads((out / t["records"][0]).read_text())) == [] for t in c["trials"])
    assert c["text"] in report and c["text"] in proc.stdout
    tuned = c["kept"] == "winner"

    # the preset is a suite `make bench` can run: plan composes both of its runs
    assert PRESET.exists()
    plan = subprocess.run([sys.executable, "-m", "harness", "plan", "suite=tuned-cpu-llama-tiny"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert "00-default" in plan.stdout and ("01-tuned" in plan.stdout) == tuned  # no gain: the default only

    # resume: a trial whose record is gone (interrupted before it was written) is the only one rerun; the
    # one taken is not the winner, so the winner usually stays and its confirmation pairs are reused (the last
    # trial was taken before; in one CI it was the winner, its rerun lost, and 4 fresh pairs cost 68 s of a 2-core box)
    gone = next(t for t in reversed(s3["trials"]) if t["status"] == "ok" and t["label"] != c["winner"])
    victim = out / gone["records"][0]
    victim.unlink()
    again = tune(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming the tune" in again.stdout
    state2 = json.loads((out / "tune.json").read_text())
    c2 = state2["confirmation"]  # the same winner: its pairs reused; another (the rerun won): fresh pairs
    assert c2["folder"] != c["folder"] or all(t["reused"] for t in c2["trials"])
    fresh_pairs = sum(not t["reused"] for t in c2["trials"])
    assert again.stdout.count("-> ok:") == 1 + fresh_pairs, again.stdout  # one trial launched, the rest reused
    rerun = [t for t in state2["steps"][2]["trials"] if t["label"] == gone["label"]]
    assert len(rerun) == 1 and not rerun[0]["reused"] and (out / rerun[0]["records"][0]).exists()
    assert all(t["reused"] for t in state2["steps"][1]["trials"] + state2["steps"][2]["trials"]
               if t is not rerun[0] and t["status"] != "skipped")


def test_tune_refuses_bad_settings_before_running(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness", "tune", f"out={tmp_path / 't'}",
                           "tune.micro_batch_sizes=[3]"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "tune.micro_batch_sizes" in proc.stderr and "must divide C" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_step_2_measures_each_checkpointing_choice_with_the_same_losses(tmp_path):
    """tune.checkpointing for real: the default (no checkpointing) and each choice at the same split,
    every trial a record whose workload carries its choice, and the same losses as the default (the
    recompute changes where the activations come from, not what they are)."""
    out = tmp_path / "tune"
    proc = subprocess.run([sys.executable, "-m", "harness", "tune", f"out={out}", "tune.steps=[2]", "tune.stages=[1]",
                           "tune.micro_batch_sizes=[2]", "tune.checkpointing=[none,every_2,selective]",
                           "tune.install_preset=false", "measure.steps=2", "measure.warmup_steps=1",
                           "measure.profile_steps=1", "tune.confirm_repeats=2"],  # the fewest pairs: not its subject
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    trials = json.loads((out / "tune.json").read_text())["steps"][0]["trials"]
    ran = {t["params"]["checkpointing"]: t for t in trials}
    assert set(ran) == {"every_2", "selective"}   # `none` at this split is the default, measured once
    for choice, t in ran.items():
        assert t["status"] == "ok" and t["parity"]["ok"], t
        rec = json.loads((out / t["records"][0]).read_text())
        validate_record(rec)
        w = rec["config"]["workload"]
        assert (w["activation_checkpointing"], w["checkpoint_every_n_layers"], w["checkpoint_policy"]) == \
            {"every_2": (True, 2, "full"), "selective": (True, 1, "selective")}[choice]
