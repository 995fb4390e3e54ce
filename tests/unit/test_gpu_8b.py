"""The paper's 8B shapes on one GPU node (conf/suite/gpu-8b-h100.yaml, gpu-8b-h200.yaml): planned with
ZeRO-3 and the optimizer offloaded to the host, and what the memory model says of them, on the GPU and
on the host (harness/model/offload.py); the refusal before launch of a run the host cannot hold."""
from __future__ import annotations

import pytest
import unit_helpers  # noqa: F401  (the repository root on sys.path)

from harness.bench import bench, plan_suite
from harness.errors import ConfigError
from harness.gpu_check import Detected, markdown, platform_overrides, summarise
from harness.launch.preflight import check_host_memory
from harness.model.memory import host_fits, memory_estimate
from harness.model.offload import (GPU_NODE_HOST_GIB, Offload, host_capacity_gib, offload_settings, on_host, pow2,
                                   read_offload, sub_groups)

GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200"}
# (platform, run) -> (workload, GPU GiB, host GiB per rank): the figures the suites' comments and
# docs/workloads.md give; usable: 70.1 GiB (H100), 124.5 (H200), host 113.3 (0.9 x the GPU nodes' 125.87)
EXPECTED = {("h200", "l8b"): ("llama-8b", 107.5, 86.8), ("h200", "l8b-kd"): ("llama-8b-kd", 97.8, 86.8),
            ("h100", "l8b"): ("llama-8b", 64.6, 103.9)}


def planned_8b(platform: str, tmp_path):
    _, planned = plan_suite([f"suite=gpu-8b-{platform}", *platform_overrides(Detected(True, 1, GPUS[platform]), []),
                             f"out={tmp_path}"])
    return planned


@pytest.mark.parametrize("platform", ["h100", "h200"])
def test_the_8b_suite_plans_zero3_with_the_optimizer_offloaded_and_fits_gpu_and_host(platform, tmp_path):
    from benchmarks.node.ops import needed_ops
    planned = planned_8b(platform, tmp_path)
    assert {(platform, p.run.name) for p in planned} == {k for k in EXPECTED if k[0] == platform}
    for p in planned:
        workload, gpu_gib, host_gib = EXPECTED[(platform, p.run.name)]
        ds = p.run.spec.deepspeed
        assert p.cfg.workload.name == workload and p.cfg.platform.name == platform and p.run.num_ranks == 1
        assert ds["zero_optimization"]["stage"] == 3 and ds["optimizer"]["type"] == "AdamW"   # DeepSpeedCPUAdam
        assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        assert [op.name for op in needed_ops("cuda", ds)] == ["cpu_adam"]      # built by preflight on the node
        est = memory_estimate(p.cfg, offload=offload_settings(ds))
        assert (round(est.total_gib, 1), round(est.host_gib, 1)) == (gpu_gib, host_gib)
        assert est.fits and host_fits(est, 1, GPU_NODE_HOST_GIB)
        assert est.total_gib <= 0.93 * est.capacity_gib and est.host_gib <= 0.93 * host_capacity_gib(GPU_NODE_HOST_GIB)
        assert est.host_gib == pytest.approx(memory_estimate(p.cfg).host_gib)   # read from deepspeed_config= alike


@pytest.mark.parametrize("platform", ["h100", "h200"])
def test_the_8b_suite_dry_runs_on_its_platform(platform, tmp_path, capsys):
    out = tmp_path / "out"
    assert bench([f"suite=gpu-8b-{platform}", *platform_overrides(Detected(True, 1, GPUS[platform]), []),
                  f"out={out}", "--dry-run"]) == 0
    assert f"dry run of suite gpu-8b-{platform}" in capsys.readouterr().out
    assert len(list(out.glob("runs/*/launch.sh"))) == (2 if platform == "h200" else 1)


def _cfg(platform: str, workload: str, mb: int, *extra: str):
    from harness.config.compose import compose
    return compose([f"platform={platform}", f"workload={workload}", "zero=stage3", "workload.optimizer=deepspeed",
                    f"workload.samples_per_step={2 * mb}", f"workload.micro_batch_size={mb}", *extra])


def test_without_offload_neither_8b_workload_fits_one_h200_and_all_of_it_on_the_host_fits_no_128_gb_node():
    host_cap = host_capacity_gib(GPU_NODE_HOST_GIB)
    l8b, kd = _cfg("h200", "llama-8b", 8, "workload.grad_accum_dtype=bf16"), _cfg("h200", "llama-8b-kd", 32)
    assert round(memory_estimate(l8b, offload=Offload()).total_gib, 1) == 155.0 > 124.5
    assert round(memory_estimate(kd, offload=Offload()).total_gib, 1) == 164.5
    everything = memory_estimate(l8b, offload=Offload("cpu", ratio=1.0, sub_group_size=450_000_000))
    assert everything.fits and round(everything.host_gib, 1) == 143.7 > host_cap
    # fp32 master, Adam m and v (12 B), the fp32 gradients (4 B, pinned) and the bf16 accumulation buffer
    assert everything.host_items_gib["fp32 master + Adam m, v of host sub-groups"] == pytest.approx(12 * 8_030_261_248 / 2**30)
    assert everything.host_items_gib["gradient accumulation buffer"] == 16.0   # 16.06 GB pinned: a 16 GiB block


def test_llama_8b_kd_does_not_fit_an_h100_node_at_any_split():
    """Its 8B teacher takes 15 GiB of the GPU: the best split leaves no margin on either side."""
    host_cap = host_capacity_gib(GPU_NODE_HOST_GIB)
    cfg = _cfg("h100", "llama-8b-kd", 4)
    best = min(max(m.total_gib / m.capacity_gib, m.host_gib / host_cap)
               for size in (100_000_000, 450_000_000, 1_000_000_000) for r in [x / 50 for x in range(51)]
               for m in [memory_estimate(cfg, offload=Offload("cpu", ratio=r, sub_group_size=size))])
    assert 0.99 < best < 1.01
    more_host = memory_estimate(cfg, offload=Offload("cpu", ratio=0.8, sub_group_size=450_000_000))
    assert (round(more_host.total_gib, 1), round(more_host.host_gib, 1)) == (57.6, 123.7)   # a ~140 GiB host would do


def test_offload_places_sub_groups_as_deepspeed_does_and_pinned_blocks_round_up():
    assert sub_groups([5, 5, 5, 2], 10) == [10, 7] and sub_groups([12, 1], 10) == [12, 1]
    assert on_host(16, 0.5) == [False] * 8 + [True] * 8 and on_host(3, 0.66) == [False, True, True]
    assert on_host(4, 0.0) == [False] * 4 and on_host(4, 1.0) == [True] * 4
    assert pow2(16_060_522_496) == 2**34 and pow2(2**31) == 2**31 and pow2(0) == 0
    ds = {"zero_optimization": {"stage": 3, "sub_group_size": 100, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}
    assert offload_settings(ds) == Offload("cpu", "none", 0.5, True, 100)
    assert offload_settings({}) == Offload() and not Offload().active
    assert read_offload("conf/deepspeed/zero3-offload-h200.json") == Offload("cpu", "none", 0.5, True, 450_000_000)


def test_offload_under_zero_1_is_not_modelled_and_says_so():
    cfg = _cfg("h200", "llama-440m", 8)
    cfg.zero.stage = 1
    est, plain = memory_estimate(cfg, offload=Offload("cpu")), memory_estimate(cfg, offload=Offload())
    assert est.total_gib == plain.total_gib and est.host_items_gib == plain.host_items_gib == {"runtime": 4.0}
    assert any("under ZeRO-1 is not modelled" in n for n in est.notes)
    assert not any("not modelled" in n for n in plain.notes)


def test_a_run_the_host_cannot_hold_is_refused_before_launch_naming_gpu_and_host(tmp_path):
    planned = planned_8b("h200", tmp_path)
    check_host_memory(planned, {"MemTotal": 125.87, "MemAvailable": 123.0})    # 0.9 x 123 = 110.7 >= 86.8: launched
    with pytest.raises(ConfigError) as exc:
        check_host_memory(planned, {"MemTotal": 125.87, "MemAvailable": 80.0})  # 72.0 < 86.8
    msg = str(exc.value)
    assert "01-l8b-kd (llama-8b-kd, ZeRO-3) needs 86.8 GiB of host memory" in msg
    assert "72.0 (0.9 x 80.0 GiB available of 125.9)" in msg and "97.8 of 124.5 GiB per GPU (fits)" in msg
    assert "a lower zero_optimization.offload_optimizer.ratio than 0.5 in conf/deepspeed/zero3-offload-h200.json" in msg
    assert "at least 96 GiB available" in msg and "OOM killer" in msg


def test_the_cpu_platform_and_runs_without_offload_are_not_held_to_the_host_check(tmp_path):
    _, planned = plan_suite(["suite=single", "platform=cpu", "workload=llama-tiny", f"out={tmp_path}"])
    check_host_memory(planned, {"MemTotal": 1.0, "MemAvailable": 0.1})          # cpu ranks: their own RLIMIT check
    _, gpu = plan_suite(["suite=single", "platform=h100", "workload=llama-440m", f"out={tmp_path / 'g'}"])
    assert memory_estimate(gpu[0].cfg).host_items_gib == {"runtime": 4.0}
    with pytest.raises(ConfigError, match="needs 4.0 GiB of host memory"):
        check_host_memory(gpu, {"MemTotal": 4.0, "MemAvailable": 4.0})


def test_gpu_check_reports_the_host_figure_of_runs_that_offload(tmp_path):
    planned = planned_8b("h200", tmp_path)
    s = summarise({}, planned, "h200", "1 x NVIDIA H200", None)
    assert s.training == []                                                      # no records: nothing reported
    from unit_helpers import typed
    ids = {p.run.name: p.run.record_ids()[0] for p in planned}
    rec = {"run_id": ids["l8b"], "status": "ok", "reason": None, "benchmark": "llama-8b",
           "metrics": {"samples_per_s": {"value": 3.1}, "mfu_pct": {"value": 7.0}, "peak_mem_gib": {"value": 101.0},
                       "step_time_s": {"value": 5.16}},
           "microsteps": [[{"phase_s": {"forward": 0.2, "backward": 0.4}}, {"phase_s": {"backward": 0.4, "step": 3.3}}]]}
    s = summarise(dict(zip([ids["l8b"]], typed([rec]))), planned, "h200", "1 x NVIDIA H200", None)
    s.host_available_gib = 123.0
    text = markdown(s)
    assert "| l8b | 3 | 8 x 2 | ok | 3.1 | 7.0 | 101.00 | 107.54 | +6.5 | - |" in text
    # the step and its optimizer phase beside the performance model's (harness/model/offload_time.py)
    assert "| l8b | optimizer cpu (ratio 0.5), param none | 86.8 | 110.7 | 5.160 (5.678) | 3.300 (3.634) |" in text


def test_gpu_check_keeps_an_offloaded_runs_measurement_when_the_model_cannot_predict_it(tmp_path, monkeypatch):
    import harness.gpu_check as gc
    from harness.errors import HarnessError
    from unit_helpers import typed

    def refuse(*_a, **_k):
        raise HarnessError("efficiency nan is not a positive number")
    monkeypatch.setattr(gc, "predict", refuse)
    planned = planned_8b("h200", tmp_path)
    rid = next(p.run.record_ids()[0] for p in planned if p.run.name == "l8b")
    rec = {"run_id": rid, "status": "ok", "reason": None, "benchmark": "llama-8b",
           "metrics": {"samples_per_s": {"value": 3.1}, "step_time_s": {"value": 5.16}, "peak_mem_gib": {"value": 101.0}},
           "microsteps": [[{"phase_s": {"step": 3.3}}]]}
    s = summarise(dict(zip([rid], typed([rec]))), planned, "h200", "1 x NVIDIA H200", None)
    s.host_available_gib = 123.0
    assert "| 5.160 (-) | 3.300 (-) |" in markdown(s)
