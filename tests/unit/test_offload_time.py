"""What ZeRO-3's optimizer offload to the host adds to a GPU's step (harness/model/offload_time.py), the
threads a rank runs its host work on (benchmarks/training/train.py rank_threads), the measurement of
the offload's rates (tests/gpu/offload_rates.py), and that an offloaded record calibrates no GPU
efficiency (its step holds the host's share, which the model adds itself)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from unit_helpers import REPO_ROOT

from benchmarks.training.train import rank_threads
from harness.config.compose import compose
from harness.model.calibration import calibrate
from harness.model.calibration_inputs import offloaded, profile_efficiency, record_efficiency
from harness.model.memory import offload_split
from harness.model.offload import offload_settings
from harness.model.offload_time import ADAM_BYTES, CAST_BYTES, host_rate, offload_time
from harness.model.params import PARAMS
from harness.model.perfmodel import efficiency_for_step_time, predict
from harness.model.text import format_prediction
from harness.record import ResultRecord

H200_8B = ["platform=h200", "workload=llama-8b", "zero=stage3", "workload.optimizer=deepspeed",
           "workload.grad_accum_dtype=bf16", "workload.samples_per_step=16", "workload.micro_batch_size=8",
           "deepspeed_config=conf/deepspeed/zero3-offload-h200.json"]


def _cfg(*extra: str, base=H200_8B):
    return compose([*base, *extra])


def test_each_mechanism_follows_its_formula_on_the_h200_8b_run():
    cfg = _cfg()
    sp = offload_split(cfg, offload_settings({"zero_optimization": {"sub_group_size": 450_000_000,
                                                                    "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}))
    host, psi = sp.host_elements, sp.elements
    assert (sp.num_host_groups, sp.num_groups) == (8, 16) and psi == 8_030_261_248 and 4.0e9 < host < 4.4e9
    p = PARAMS
    off = offload_time(cfg, backward_s=0.5)
    bw = p.offload_host_gbps * 1e9
    assert off.items["host Adam"] == pytest.approx(host / min(16 * p.offload_adam_elements_per_s, bw / ADAM_BYTES))
    assert off.items["cast to bf16"] == pytest.approx(host / min(16 * p.offload_cast_elements_per_s, bw / CAST_BYTES))
    assert off.items["parameters to the GPU"] == pytest.approx(2 * host / (p.pcie_pageable_gbps * 1e9))
    # bf16 accumulation, ga 2: down and up at each micro-step, the host groups' fp32 down at the boundary
    assert off.items["gradients over PCIe"] == pytest.approx((2 * 2 * psi * 2 + 4 * host) / (p.pcie_pinned_gbps * 1e9))
    assert off.step_s == pytest.approx(off.items["host Adam"] + off.items["cast to bf16"] + off.items["parameters to the GPU"])
    assert off.exposed_grads_s == pytest.approx(off.grads_s - 0.5)
    assert offload_time(cfg, backward_s=100.0).exposed_grads_s == 0.0     # hidden behind a long backward


def test_host_work_is_capped_by_the_memory_bandwidth_and_scales_with_threads_below_it():
    assert host_rate(1e9, 2, 1000.0, 28) == 2e9
    assert host_rate(1e9, 64, 28.0, 28) == 1e9
    slow = dataclasses.replace(PARAMS, offload_host_threads=1)
    one, sixteen = offload_time(_cfg(), 0.5, slow), offload_time(_cfg(), 0.5)
    assert one.items["host Adam"] > 3.5 * sixteen.items["host Adam"]     # what one thread a rank cost (5.8 s, 1.6)


def test_nothing_is_added_without_optimizer_offload_or_on_the_cpu_platform():
    assert offload_time(_cfg("deepspeed_config=null"), 0.5) is None
    assert offload_time(compose(["platform=cpu", "workload=llama-tiny", "zero=stage3",
                                 "deepspeed_config=conf/deepspeed/zero3-offload-h200.json"]), 0.5) is None


def test_the_prediction_adds_the_offload_and_prints_each_mechanism():
    cfg = _cfg()
    pred = predict(cfg, calibrate([], cfg, []))
    bare = predict(_cfg("deepspeed_config=null"), calibrate([], cfg, []))
    assert pred.offload_s > 1.0 and bare.offload_s == 0.0 and bare.offload is None
    assert pred.step_time_s == pytest.approx(pred.compute_s + pred.exposed_comm_s + pred.host_wait_s + pred.offload_s
                                             + pred.optimizer_s)
    text = format_prediction(pred)
    assert "optimizer offload to the host" in text and "host Adam" in text and "+ optimizer offload" in text
    assert json.loads(json.dumps(pred.to_dict()))["offload"]["items_s"]["host Adam"] > 0   # the JSON carries it
    # the inversion of a step time counts the offload: the same efficiency comes back (seq 2048: GPU-bound)
    long = _cfg("workload.seq_len=2048")
    pred = predict(long, calibrate([], long, []))
    assert pred.host_wait_s == 0 and pred.offload_s > 1.0
    back = efficiency_for_step_time(long, calibrate([], long, []), pred.step_time_s)
    assert back == pytest.approx(pred.efficiency, rel=1e-6)


def _record(device: str, offload: bool) -> ResultRecord:
    ds = {"zero_optimization": {"stage": 3, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}}
    return ResultRecord(schema_version="1", run_id="r", kind="training", benchmark="llama-8b", platform="h200",
                        status="ok", reason=None, config={"platform": {"device": device}, "deepspeed": ds},
                        overrides=[], environment={}, metrics={"step_time_s": {"value": 4.0}},
                        microsteps=[[{"compute_s": 4.0}]])


def test_an_offloaded_gpu_record_calibrates_no_efficiency():
    assert offloaded(_record("cuda", True)) and not offloaded(_record("cuda", False))
    assert not offloaded(_record("cpu", True))             # on cpu the host is the device: it calibrates as ever
    cfg = _cfg()
    assert profile_efficiency(_record("cuda", True), cfg) is None
    assert record_efficiency(_record("cuda", True), cfg, {}) is None


@pytest.mark.parametrize("device, environ, usable, threads", [
    ("cuda", {}, 16, 16),                                        # one rank on a 16-core node: all of them
    ("cuda", {"LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "1"}, 112, 14),   # torchrun's 1 is not the suite's
    ("cuda", {"LOCAL_WORLD_SIZE": "8"}, 4, 1),                   # never 0
    ("cuda", {"LOCAL_WORLD_SIZE": "8", "SUITE_HOST_THREADS": "6"}, 112, 6),   # platform.host_threads, as the plan passes it
    ("cpu", {"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "2"}, 16, 3),      # the platform's cpu_threads
    ("cpu", {}, 16, 1),
])
def test_a_rank_runs_its_share_of_the_node_on_a_gpu_and_the_platforms_threads_on_cpu(device, environ, usable, threads):
    assert rank_threads(device, environ, usable) == threads


def test_a_users_host_threads_reach_the_ranks_and_the_models_offload_time():
    import warnings
    from harness.errors import ConfigError
    from harness.plan import rank_env

    def env(c):
        return rank_env(c, REPO_ROOT, REPO_ROOT / ".cache")

    cfg = _cfg("platform.host_threads=2")
    assert env(cfg)["SUITE_HOST_THREADS"] == "2" and "SUITE_HOST_THREADS" not in env(_cfg())
    two, auto = offload_time(cfg, 0.5), offload_time(_cfg(), 0.5)
    # 16 threads step at most the host's 106 GB/s over 28 B an element; 2 threads step 2 x 0.237e9 elements/s
    assert two.items["host Adam"] / auto.items["host Adam"] == pytest.approx(min(16 * 0.237e9, 106e9 / 28) / (2 * 0.237e9))
    assert "at 2 threads" in two.notes[0] and "at 16 threads" in auto.notes[0]
    with pytest.raises(ConfigError, match="platform.host_threads"):
        _cfg("platform.host_threads=0")
    with pytest.warns(UserWarning, match="platform.cpu_threads sets a rank's threads there"):
        compose(["platform=cpu", "platform.host_threads=4"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cfg("platform.host_threads=null")


def test_the_rates_script_measures_adam_the_cast_and_the_triad_on_cpu(tmp_path):
    out = tmp_path / "rates.json"
    subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "gpu" / "offload_rates.py"), "--elements", "1e5",
                    "--repeats", "1", "--threads", "1", "--out", str(out)], check=True, capture_output=True, timeout=300,
                   cwd=REPO_ROOT)
    d = json.loads(out.read_text())
    assert d["cast_elements_per_s"]["1"] > 0 and d["triad_gbps"] > 0 and d["copies_gbps"] is None
    # DeepSpeedCPUAdam where cpu_adam is built for this installation; else the reason, the rest measured
    assert (d["adam_elements_per_s"].get("1", 0) > 0) != bool(d["adam_error"])
