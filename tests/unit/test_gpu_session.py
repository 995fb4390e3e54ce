"""The bounded one-call script for a GPU node without network access (tests/gpu/offline_node.sh) and
the suites it runs: checked here, where no GPU is, so that a GPU node's time is not spent on a typo."""
from __future__ import annotations

import re
import subprocess

import pytest
from unit_helpers import REPO_ROOT

from harness.bench import plan_suite

SCRIPT = REPO_ROOT / "tests" / "gpu" / "offline_node.sh"


def test_the_script_parses_and_names_only_what_exists():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text(encoding="utf-8")
    for suite in re.findall(r"ZERO3_SUITE:-([\w-]+)", text) + ["gpu-zero3-layers"]:
        assert (REPO_ROOT / "conf" / "suite" / f"{suite}.yaml").is_file(), suite
    for path in re.findall(r"python3 (tests/gpu/[\w.]+\.py)", text):
        assert (REPO_ROOT / path).is_file(), path
    assert "history=none" in text and "timeout" in text     # no store there; every step bounded


@pytest.mark.parametrize("platform", ["h200", "h100"])
def test_the_zero3_host_cost_suites_plan_llama_440m_under_zero_1_and_3(platform):
    _, host = plan_suite([f"platform={platform}", "suite=gpu-zero3-host"])
    assert [(p.cfg.zero.stage, p.cfg.workload.micro_batch_size, p.cfg.workload.grad_acc_steps) for p in host] == \
        [(1, 8, 4), (3, 8, 4), (1, 32, 4), (3, 32, 4)]
    _, layers = plan_suite([f"platform={platform}", "suite=gpu-zero3-layers"])
    assert [(p.cfg.zero.stage, p.cfg.workload.num_layers) for p in layers] == [(1, 6), (3, 6), (1, 12), (3, 12)]
    assert all(p.cfg.workload.name == "llama-440m" for p in host + layers)


def test_the_compute_breakdown_runs_on_cpu_at_a_tiny_size(tmp_path):
    import json
    import sys
    out = tmp_path / "cb.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "gpu" / "compute_breakdown.py"), "--mb", "2", "--seq", "16",
                    "--layers", "1", "--hidden", "64", "--ffn", "176", "--heads", "2", "--vocab", "256", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["micro_step_wall_ms"] > 0 and d["device_ms_by_class"]
    assert set(d["gemm"]) == {"qkv/o", "gate/up", "down", "lm_head", "plateau"}
