"""The bounded one-call scripts for a GPU node without network access (tests/gpu/*_node.sh) and the
suites they run: checked here, where no GPU is, so that a GPU node's time is not spent on a typo. Each
script is also run through with the node's python3, nvidia-smi and timeout stood in for: the harness
commands it gives, in its order, each under a positive bound, and its fallbacks."""
from __future__ import annotations

import dataclasses
import os
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
    assert d["args"]["attention"] == "auto" and "clocks_while_timed" not in d     # clocks: a GPU's alone


def test_the_compute_breakdown_pins_the_sdpa_backend_it_is_given(tmp_path):
    """--attention math: the micro-steps run under SDPA's math backend (on cpu too), for the math step the
    model explains only in part; the clocks' sampler reads nothing without nvidia-smi."""
    import json
    import sys
    out = tmp_path / "cb.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "gpu" / "compute_breakdown.py"), "--mb", "2", "--seq", "16",
                    "--layers", "1", "--hidden", "64", "--ffn", "176", "--heads", "2", "--vocab", "256",
                    "--attention", "math", "--out", str(out)], check=True, capture_output=True, timeout=300)
    d = json.loads(out.read_text())
    assert d["args"]["attention"] == "math" and d["micro_step_wall_ms"] > 0
    assert not any("flash" in k for _, k in d["top_kernels_ms"])      # auto runs flash on cpu: math did not


def test_the_compute_breakdown_samples_the_gpus_clock_and_power(tmp_path, monkeypatch):
    """Clocks reads nvidia-smi's `clocks.sm, power.draw` every interval while the micro-steps are timed (a
    stand-in nvidia-smi here, its readings given in turn); without nvidia-smi it says nothing."""
    import sys
    import time
    sys.path.insert(0, str(REPO_ROOT / "tests" / "gpu"))
    try:
        from compute_breakdown import Clocks
    finally:
        sys.path.pop(0)
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "nvidia-smi").write_text('#!/bin/bash\nn=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) >"$COUNT"\n'
                                         'case $n in 0) echo "1980, 650.5" ;; 1) echo "1755, 700.1" ;; *) echo "1830, 690.0" ;; esac\n')
    (stand_in / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{stand_in}:{os.environ['PATH']}")
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    with Clocks(every=0.01) as c:
        deadline = time.monotonic() + 20
        while len(c.rows) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    got = c.summary()
    assert got["sm_mhz"]["min"] == 1755 and got["sm_mhz"]["max"] == 1980 and got["power_w"]["max"] == 700.1
    assert got["samples"] >= 3
    monkeypatch.setenv("PATH", "/nonexistent")
    with Clocks(every=0.01) as none:
        time.sleep(0.05)
    assert none.summary() == {}


# --- every one-call script, run through on this box with the node's commands stood in for --------------
NODE_SCRIPTS = sorted((REPO_ROOT / "tests" / "gpu").glob("*_node.sh"))
STAND_INS = {
    "python3": """#!/bin/bash
echo "python3 $*" >>"$CALLS"
case "$*" in
  -) cat >/dev/null; echo "3.12.3 torch 2.13.0 cuda 13.0 (stand-in)" ;;
  *platform_overrides*"split("*) echo "$GPU_PLATFORM" ;;
  *platform_overrides*) echo "platform=$GPU_PLATFORM" ;;
  *"import torchao.float8"*) exit "${TORCHAO_FAILS:-0}" ;;
  *"ops build dc "*) exit "${DC_FAILS:-0}" ;;
esac
exit 0
""",
    "nvidia-smi": "#!/bin/bash\necho 1024\n",
    # the bound each step gets, then the step itself
    "timeout": """#!/bin/bash
while [ "${1#-}" != "$1" ]; do [ "$1" = -k ] && shift; shift; done
echo "timeout $1" >>"$CALLS"; shift
exec "$@"
""",
}


def dry_run(script, tmp_path, platform: str, **env) -> tuple[list[str], str]:
    """The script run through with python3, nvidia-smi and timeout stood in for: the commands it gave
    (each bound as `timeout N` before the command it bounds) and its session log."""
    import os
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    for name, text in STAND_INS.items():
        (stand_in / name).write_text(text)
        (stand_in / name).chmod(0o755)
    calls, out = tmp_path / "calls", tmp_path / "out"
    proc = subprocess.run(["bash", str(script)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": f"{stand_in}:{os.environ['PATH']}", "CALLS": str(calls),
                               "OUT": str(out), "GPU_PLATFORM": platform, **env})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (out / "records.tar.gz").is_file()
    calls_ = calls.read_text().splitlines()
    for before, call in zip(["timeout 0"] + calls_, calls_):  # a hung import or GPU query ends within its bound
        if call.startswith("python3") and " -m pip " not in f" {call} ":
            assert before.startswith("timeout "), f"{script.name}: unbounded {call[:120]}"
    return calls_, (out / "session.log").read_text()


def harness_steps(calls: list[str]) -> list[tuple[int, str]]:
    """(bound in seconds, command) of every harness command and tests/gpu script the node runs."""
    steps = []
    for before, call in zip(["timeout 0"] + calls, calls):
        if call.startswith("python3 -m harness") or call.startswith("python3 tests/gpu/"):
            assert before.startswith("timeout "), f"unbounded: {call}"
            steps.append((int(before.split()[1]), call[len("python3 "):]))
    return steps


@pytest.mark.parametrize("script", NODE_SCRIPTS, ids=lambda p: p.name)
def test_each_node_script_parses_and_names_suites_and_scripts_that_exist(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = "\n".join(line for line in script.read_text(encoding="utf-8").splitlines() if not line.startswith("#"))
    for suite in re.findall(r"suite=([\w-]+)(?![\w$<-])", text):
        assert (REPO_ROOT / "conf" / "suite" / f"{suite}.yaml").is_file(), (script.name, suite)
    for path in re.findall(r"(tests/gpu/[\w.]+\.(?:py|sh))", text):
        assert (REPO_ROOT / path).is_file(), (script.name, path)
    assert "history=none" in text or "-m harness" not in text    # the node has no store


@pytest.mark.parametrize("platform", ["h200", "h100"])
def test_the_kd_and_8b_script_runs_the_distillation_check_then_its_gpus_8b_suite_each_bounded(tmp_path, platform):
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "kd_8b_node.sh", tmp_path, platform)
    steps = harness_steps(calls)
    assert [s.split(" out=")[0].split(" --out ")[0] for _, s in steps] == [
        "-m harness gpu-check suite=gpu-check-kd", "tests/gpu/offload_rates.py --elements 1e8",
        f"-m harness gpu-check suite=gpu-8b-{platform}"]
    (kd, _), (rates, _), (l8b, _) = steps
    assert 200 <= kd <= 540 - 300 and 120 < l8b < 540    # the 8B suite keeps 300 s of the 540
    assert rates <= 45 and "python3 -m benchmarks.node.ops build cpu_adam --accelerator cuda" in calls
    assert "gpu-check-kd exit 0" in session and "offload rates exit 0" in session and "gpu-8b exit 0" in session
    steps.pop(1)
    for _, step in steps:
        suite = re.search(r"suite=([\w-]+)", step).group(1)
        plan_suite([f"platform={platform}", f"suite={suite}"])    # composes and plans on this box


def test_the_kd_script_runs_the_whole_gpu_check_when_asked(tmp_path):
    calls, _ = dry_run(REPO_ROOT / "tests" / "gpu" / "kd_8b_node.sh", tmp_path, "h200", FULL="1")
    assert [s.split(" out=")[0] for _, s in harness_steps(calls)][0] == "-m harness gpu-check suite=gpu-check"


def test_the_kd_script_can_run_the_8b_distillation_alone(tmp_path):
    """What the H200 of 2026-12-04 left: llama-8b-kd (stopped on transformers 5.17's missing
    activation_checkpointing_enable); the rest measured."""
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "kd_8b_node.sh", tmp_path, "h200", KD="0", ONLY_8B="l8b-kd")
    steps = harness_steps(calls)
    assert [s.split(" out=")[0].split(" --out ")[0] for _, s in steps] == [
        "tests/gpu/offload_rates.py --elements 1e8", "-m harness gpu-check suite=gpu-8b-h200 only=[l8b-kd]"]
    assert "skipped (KD=0)" in session and steps[1][0] > 400
    _, planned = plan_suite(["platform=h200", "suite=gpu-8b-h200", "only=[l8b-kd]"])
    assert [p.run.name for p in planned] == ["l8b-kd"]


@pytest.mark.parametrize("torchao_fails", [False, True])
def test_the_stack_script_runs_the_stack_suites_and_falls_back_to_the_older_torchao(tmp_path, torchao_fails):
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "stack_node.sh", tmp_path, "h200",
                             TORCHAO_FAILS="1" if torchao_fails else "0")
    steps = harness_steps(calls)
    assert [s.split(" out=")[0] for _, s in steps] == [
        "-m harness gpu-check suite=gpu-stack", "-m harness bench platform=h200 suite=gpu-stack-extra",
        "tests/gpu/compute_breakdown.py --compile --out /tmp/gpu-stack-extra/compute_breakdown_compiled_mb128.json"]
    assert all(bound > 0 for bound, _ in steps) and steps[0][0] >= 540 - 170 - 30
    fallback = [c for c in calls if ".whl/torchao016/" in c]
    assert bool(fallback) == torchao_fails and ("torchao 0.16 instead" in session) == torchao_fails
    for suite in ("gpu-stack", "gpu-stack-extra"):
        plan_suite(["platform=h200", f"suite={suite}"])


def test_the_offline_script_runs_gpu_check_then_the_zero3_host_cost_then_the_breakdown(tmp_path):
    calls, session = dry_run(SCRIPT, tmp_path, "h100")
    steps = harness_steps(calls)
    assert [s.split(" out=")[0] for _, s in steps] == [
        "-m harness gpu-check", "-m harness bench platform=h100 suite=gpu-zero3-host",
        "tests/gpu/compute_breakdown.py --out /tmp/gpu-zero3-host/compute_breakdown_mb128.json"]
    assert all(bound > 0 for bound, _ in steps) and "gpu-zero3-host exit 0" in session


@pytest.mark.parametrize("dc_fails", [False, True])
def test_the_compile_host_script_runs_deepcompile_and_the_layer_shapes_and_without_deepcompile_if_its_op_fails(
        tmp_path, dc_fails):
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "compile_host_node.sh", tmp_path, "h100",
                             DC_FAILS="1" if dc_fails else "0")
    (bound, step), = harness_steps(calls)
    assert step.startswith("-m harness bench platform=h100 suite=gpu-compile-host") and 400 < bound < 540
    assert "python3 -m benchmarks.node.ops build dc --accelerator cuda" in calls
    assert ("only=[" in step) == dc_fails and ("without its DeepCompile runs" in session) == dc_fails
    only = re.search(r"(only=\[[^\]]*\])", step)
    _, planned = plan_suite(["platform=h100", "suite=gpu-compile-host", *([only.group(1)] if only else [])])
    names = [p.run.name for p in planned]
    assert any("deepcompile" in n or n.startswith("dc-") for n in names) != dc_fails and len(names) == (10 if dc_fails else 13)
    # last, two twins with DeepSpeed's throughput timer unsynchronised: the rest of their configuration their twins'
    assert names[-2:] == ["c-z1-L12-mb8-unsynced", "e-z3-L12-mb8-unsynced"]
    for p in planned[-2:]:
        twin = next(q for q in planned if q.run.name == p.run.name.removesuffix("-unsynced"))
        assert p.run.config["deepspeed"]["timers"] == {"throughput": {"synchronized": False}}
        assert dataclasses.replace(p.cfg, deepspeed_config=None) == twin.cfg
    # each stack and stage class at two layer counts: a line for tests/perf/host_floor.py
    for stack in ("c-z3", "c-z1", "e-z3", "e-z1", *([] if dc_fails else ["dc-z3"])):
        assert {p.cfg.workload.num_layers for p in planned if p.run.name.startswith(stack + "-")} == {6, 12}
    # the floor the model's compiled ZeRO 0-2 runs use comes first after DeepCompile at gpu-check's size
    assert names[:3] == (["c-z1-L12-mb8", "c-z1-L6-mb8", "c-z3-L12-mb8"] if dc_fails else
                         ["z3-deepcompile", "c-z1-L12-mb8", "c-z1-L6-mb8"])
    assert {p.cfg.workload.compile.value for p in planned} == ({"torch", "none"} if dc_fails else {"deepcompile", "torch", "none"})


def test_the_compile_host_script_runs_the_runs_asked_for(tmp_path):
    """What the H200 of 2026-12-04 left of gpu-compile-host (its bound cut the suite after 4 of 13 runs)."""
    left = "dc-z3-L6-mb8,c-z3-L12-mb8,c-z3-L6-mb8,z3-deepcompile"
    calls, _ = dry_run(REPO_ROOT / "tests" / "gpu" / "compile_host_node.sh", tmp_path, "h200", RUNS=left)
    (bound, step), = harness_steps(calls)
    assert f"only=[{left}]" in step and bound > 300
    only = re.search(r"(only=\[[^\]]*\])", step).group(1)
    _, planned = plan_suite(["platform=h200", "suite=gpu-compile-host", only])
    assert sorted(p.run.name for p in planned) == sorted(left.split(","))
    (tmp_path / "failed").mkdir()
    calls, _ = dry_run(REPO_ROOT / "tests" / "gpu" / "compile_host_node.sh", tmp_path / "failed", "h200", RUNS=left,
                       DC_FAILS="1")
    (_, step), = harness_steps(calls)
    assert "only=[c-z3-L12-mb8,c-z3-L6-mb8]" in step     # DeepCompile's runs dropped: its op did not build


def test_the_breakdown_script_profiles_eager_compiled_and_math_each_bounded(tmp_path):
    """Two model questions of 2026-12-04 on one node: the compiled GEMMs' clocks, and what attention=math costs."""
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "breakdown_node.sh", tmp_path, "h100")
    steps = harness_steps(calls)
    assert [s for _, s in steps] == [
        f"tests/gpu/compute_breakdown.py {args}--out /tmp/breakdown/compute_breakdown_{what}_mb128.json"
        for what, args in (("eager", ""), ("compiled", "--compile "), ("math", "--attention math "))]
    assert [b for b, _ in steps] == [90, 150, 90] and all(f"{w} exit 0" in session for w in ("eager", "compiled", "math"))
    (tmp_path / "short").mkdir()      # each bound within what is left (the stand-ins take no time)
    calls, _ = dry_run(REPO_ROOT / "tests" / "gpu" / "breakdown_node.sh", tmp_path / "short", "h100", BUDGET_S="100")
    bounds = [b for b, _ in harness_steps(calls)]
    assert len(bounds) == 3 and all(75 <= b <= 85 for b in bounds)     # 100 s less the 15 kept, less what went by
    (tmp_path / "none").mkdir()
    calls, session = dry_run(REPO_ROOT / "tests" / "gpu" / "breakdown_node.sh", tmp_path / "none", "h100", BUDGET_S="40")
    assert harness_steps(calls) == [] and "math skipped" in session
