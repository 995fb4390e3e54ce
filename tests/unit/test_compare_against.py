"""`python -m harness compare NEW... --against OLD...`: one set of records judged against another, the
before/after around an upgrade, with no reference table and no `submit` in between."""
from __future__ import annotations

import json
import random

import pytest

from contract.metrics import tolerances_for
from harness.__main__ import main
from harness.verdict.ab import against
from harness.report.verdicts import change_text, ratio

ENV = {"python": "3.11.7", "torch": "2.4.0", "deepspeed": "0.15.1", "transformers": "4.44.0", "nccl": None,
       "driver": None, "cuda": None, "gpu_model": None, "gpu_count": 0, "container_image": None,
       "hosts": ["box"], "num_nodes": 1, "num_ranks": 2, "env": {}, "suite_commit": "abc"}


def record(run_id: str, samples_per_s: float, stage: int = 2, status: str = "ok", env: dict | None = None) -> dict:
    """A schema-valid cpu training record of llama-tiny; step time follows samples/s (8 samples a step)."""
    metrics = {"samples_per_s": (samples_per_s, "samples/s"), "tokens_per_s": (samples_per_s * 128, "tokens/s"),
               "step_time_s": (8 / samples_per_s, "s"), "peak_mem_gib": (1.5, "GiB"), "mfu_pct": (1.0, "%")}
    return {"schema_version": "1.0", "run_id": run_id, "kind": "training", "platform": "cpu",
            "benchmark": "llama-tiny", "status": status, "reason": None if status == "ok" else "out of memory",
            "config": {"platform": {"nodes": 1}, "zero": {"stage": stage},
                       "workload": {"micro_batch_size": 4, "grad_acc_steps": 2, "seq_len": 128, "precision": "fp32"}},
            "overrides": [f"zero=stage{stage}"], "environment": env or ENV, "microsteps": [],
            "metrics": {k: {"value": v, "unit": u} for k, (v, u) in metrics.items()} if status == "ok" else {}}


def noisy(center: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(center, center * 0.02) for _ in range(n)]


def write(folder, records: list[dict]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for r in records:
        (folder / f"{r['run_id']}.json").write_text(json.dumps(r), encoding="utf-8")
    return str(folder)


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["compare", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one(verdicts, metric="samples_per_s"):
    (v,) = [v for v in verdicts if v.metric == metric]
    return v


def test_a_slowdown_after_a_torch_upgrade_is_a_regression_naming_the_upgrade(tmp_path, capsys):
    old = write(tmp_path / "old", [record(f"old{i}", v) for i, v in enumerate(noisy(22.0, 4, seed=1))])
    upgraded = {**ENV, "torch": "2.5.1"}
    new = write(tmp_path / "new", [record(f"new{i}", v, env=upgraded) for i, v in enumerate(noisy(13.8, 3, seed=2))])
    verdicts, left = against([new], [old])
    v = one(verdicts)
    assert v.verdict == "regression" and left == ""
    assert v.environment_diff == {"torch": ["2.4.0", "2.5.1"]}
    # the four OLD runs of one configuration are one reference with all four samples (both sides resampled)
    assert (v.num_samples, v.num_reference_samples) == (3, 4)
    assert v.tolerance_pct == tolerances_for("cpu")["default"]
    assert one(verdicts, "step_time_s").verdict == "regression"

    rc, out, _ = run(capsys, new, "--against", old)
    assert rc == 1
    assert out.startswith("verdict") and "now/OLD" in out
    assert "what changed since OLD: torch: 2.4.0 -> 2.5.1" in out
    assert change_text(v).endswith("x slower)") and 0.55 < ratio(v.worse_pct, "higher") < 0.7
    assert f"samples_per_s  {v.value:.3f}" in out and change_text(v) in out

    rc, out, _ = run(capsys, new, "--against", old, "--json")
    (row,) = [r for r in json.loads(out) if r["metric"] == "samples_per_s"]
    assert rc == 1 and row["change"] == change_text(v) and "gain " not in row["reason"]


def test_the_same_distribution_on_both_sides_passes(tmp_path, capsys):
    old = write(tmp_path / "old", [record(f"old{i}", v) for i, v in enumerate(noisy(22.0, 5, seed=3))])
    new = write(tmp_path / "new", [record(f"new{i}", v) for i, v in enumerate(noisy(22.0, 5, seed=4))])
    verdicts, _ = against([new], [old])
    assert {v.verdict for v in verdicts} == {"pass"}
    rc, out, _ = run(capsys, new, "--against", old)
    assert rc == 0 and "regression" not in out and "missing" not in out


def test_old_without_new_is_one_line_and_new_without_old_is_new(tmp_path, capsys):
    old = write(tmp_path / "old", [record(f"z2-{i}", 22.0 + i) for i in range(2)]
                + [record(f"z3-{i}", 15.0 + i, stage=3) for i in range(3)])
    new = write(tmp_path / "new", [record(f"z2-{i}", 22.5 + i) for i in range(2)]
                + [record(f"z1-{i}", 30.0 + i, stage=1) for i in range(2)])
    verdicts, left = against([new], [old])
    assert {v.verdict for v in verdicts if v.config["zero_stage"] == 1} == {"new"}
    assert not [v for v in verdicts if v.verdict == "missing"]
    assert left.startswith("3 results of --against with no counterpart in NEW: cpu/llama-tiny ZeRO-3")
    rc, out, _ = run(capsys, new, "--against", old)
    assert rc == 0
    assert out.count("no counterpart in NEW") == 1 and "missing" not in out
    rows = [line.split() for line in out.splitlines()[2:] if line.startswith(("new ", "pass "))]
    assert {r[1] for r in rows} == {"c1", "c2"}, "a label tells the configurations apart"
    assert "c1  cpu/llama-tiny ZeRO-1 " in out and "c2  cpu/llama-tiny ZeRO-2 " in out, "each label once in full below"


def test_a_configuration_that_ran_out_of_memory_before_and_runs_now_is_a_status_change(tmp_path):
    old = write(tmp_path / "old", [record(f"old{i}", 1.0, stage=3, status="oom") for i in range(2)])
    new = write(tmp_path / "new", [record(f"new{i}", v, stage=3) for i, v in enumerate([15.0, 15.2])])
    v = one(against([new], [old])[0])
    assert v.verdict == "status changed" and v.reason.startswith("oom -> ok")


def test_against_and_reference_exclude_each_other(tmp_path, capsys):
    new = write(tmp_path / "new", [record("n0", 20.0)])
    old = write(tmp_path / "old", [record("o0", 20.0)])
    rc, out, err = run(capsys, new, "--against", old, "--reference", str(tmp_path / "ref.json"))
    assert rc == 2 and out == ""
    assert "--against and --reference exclude each other" in err


@pytest.mark.parametrize("side", ["NEW", "--against"])
@pytest.mark.parametrize("bad,message", [
    ("nowhere", "{path}: no such file or folder"),
    ("empty", "no result records in {path}"),
    ("notes.json", "{path}: not a valid record"),
])
def test_bad_input_on_either_side_stops_naming_the_side_and_the_path(tmp_path, capsys, side, bad, message):
    good = write(tmp_path / "good", [record("r0", 20.0), record("r1", 20.5)])
    path = tmp_path / bad
    if bad == "empty":
        path.mkdir()
    elif bad == "notes.json":
        path.write_text('{"note": "not a record"}', encoding="utf-8")
    args = [str(path), "--against", good] if side == "NEW" else [good, "--against", str(path)]
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: {side}: ") and message.format(path=path) in err
