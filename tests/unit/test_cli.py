"""The command line as a user types it: `python -m harness <command> [overrides]`.

The commands are independent, so they are started together (one module fixture) and each test
checks one of them: the unit suite stays fast on a 2-core box."""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import pytest

from unit_helpers import REPO_ROOT, VENV_PYTHON, options

DEFAULT_RUN_IDS = ["00-collectives", "01-z1-mb2-ga4", "02-z1-mb4-ga2", "03-z2-mb2-ga4",
                   "04-z2-mb4-ga2", "05-z3-mb2-ga4", "06-z3-mb4-ga2", "07-kd-z3-mb4-ga2"]


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


def _valid_record() -> dict:
    env = {"python": "3.11.7", "torch": None, "deepspeed": None, "transformers": None, "cuda": None,
           "nccl": None, "driver": None, "gpu_model": None, "gpu_count": 0, "container_image": None,
           "env": {}, "hosts": ["h"], "suite_commit": None}
    return {"schema_version": "1.0", "run_id": "00-x", "kind": "training", "benchmark": "llama-tiny",
            "platform": "cpu", "status": "oom", "reason": "rank 0: out of memory", "config": {},
            "overrides": [], "environment": env, "metrics": {}, "microsteps": []}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    good, bad = tmp / "good.json", tmp / "bad.json"
    good.write_text(json.dumps(_valid_record()), encoding="utf-8")
    bad.write_text(json.dumps({**_valid_record(), "status": "exploded"}), encoding="utf-8")
    commands = {
        "help": ["--help"],
        "unknown": ["frobnicate"],
        "bad-group": ["plan", "zero=stage7"],
        "plan": ["plan"],
        "validate": ["validate", str(good), str(bad)],
        "model-validate": ["model", "--validate", "--json"],
    }
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(REPO_ROOT / ".cache" / "torch_extensions")}
    procs = {name: subprocess.Popen([VENV_PYTHON, "-m", "harness", *argv], cwd=REPO_ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, argv in commands.items()}
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            results[name] = Result(proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results["paths"] = (good, bad)
    return results


def test_help_lists_commands_and_every_group_with_its_options(cli):
    r = cli["help"]
    assert r.rc == 0, r.stderr
    lines = r.stdout.splitlines()
    for command in ("bench", "plan", "validate"):
        assert any(line.split()[:1] == [command] for line in lines), f"command {command} not listed"
    for group in ("platform", "workload", "zero", "suite"):
        expected = ", ".join(options(group))
        assert any(line.split(None, 1) == [group, expected] for line in lines), \
            f"group {group} should list: {expected}"


def test_unknown_command_exits_2_and_names_the_valid_ones(cli):
    r = cli["unknown"]
    assert r.rc == 2
    assert "unknown command 'frobnicate'" in r.stderr
    assert "bench, collect, plan, validate" in r.stderr


def test_bad_group_option_exits_2_with_the_valid_options_and_no_traceback(cli):
    r = cli["bad-group"]
    assert r.rc == 2
    assert "stage7" in r.stderr
    assert "valid zero options: " + ", ".join(options("zero")) in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_plan_prints_every_run_of_the_default_suite(cli):
    r = cli["plan"]
    assert r.rc == 0, r.stderr
    assert "Traceback" not in r.stderr
    for run_id in DEFAULT_RUN_IDS:
        assert f"\n{run_id}: 2 ranks" in r.stdout, run_id
    ds_lines = [line for line in r.stdout.splitlines() if line.strip().startswith("deepspeed: ")]
    ds = [json.loads(line.split("deepspeed: ", 1)[1]) for line in ds_lines]
    assert [d["zero_optimization"]["stage"] for d in ds] == [1, 1, 2, 2, 3, 3, 3]
    assert [(d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"]) for d in ds] == [
        (2, 4), (4, 2)] * 3 + [(4, 2)]
    assert all(d["train_batch_size"] == 16 for d in ds)
    assert "collectives: all_reduce, all_gather, reduce_scatter, broadcast" in r.stdout
    assert not (REPO_ROOT / r.stdout.split("out: ", 1)[1].split()[0]).exists(), "plan writes nothing"


def test_validate_reports_each_file_and_exits_1_on_a_bad_record(cli):
    r = cli["validate"]
    good, bad = cli["paths"]
    assert r.rc == 1
    assert f"{good}: valid" in r.stdout
    assert f"{bad}: INVALID" in r.stdout
    assert "status: 'exploded' is not one of" in r.stdout


def test_model_validate_reports_every_published_cell_and_meets_the_targets(cli):
    """`python -m harness model --validate --json`: 34 cells, the per-table medians, the findings and
    the targets, exit 0 when every target holds (make validate-model)."""
    r = cli["model-validate"]
    assert r.rc == 0, r.stdout[-3000:] + r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert data["ok"] and len(data["cells"]) == 34 and len(data["tables"]) == 2
    assert all(t["ok"] for t in data["targets"]) and data["findings"]
