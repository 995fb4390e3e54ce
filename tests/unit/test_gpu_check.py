"""`make gpu-check` (harness/gpu_check.py): its CPU-side logic. The run itself needs a GPU
(tests/integration/test_gpu_check.py runs the whole flow on the cpu platform)."""
from __future__ import annotations

import pytest
from unit_helpers import typed

from harness.bench import plan_suite
from harness.config.choices import RunKind
from harness.errors import HarnessError
from harness.gpu_check import EXIT_NO_GPU, Detected, gpu_check, markdown, platform_overrides, summarise


def test_without_cuda_it_says_so_and_exits_non_zero_having_written_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    rc = gpu_check([f"out={out}"], Detected(False, why="torch 2.13.0+cpu sees no CUDA device (a CPU-only build of torch)"))
    assert rc == EXIT_NO_GPU != 0
    err = capsys.readouterr().err
    assert "gpu-check needs a node with NVIDIA GPUs" in err and "CPU-only build" in err and "make bench" in err
    assert not out.exists()


@pytest.mark.parametrize("name,count,platform", [
    ("NVIDIA H100 80GB HBM3", 1, "h100"), ("NVIDIA H100 80GB HBM3", 8, "h100"), ("NVIDIA H200", 1, "h200"),
    ("NVIDIA A100-SXM4-80GB", 8, "ib-a100")])
def test_the_platform_is_the_detected_gpus_on_this_node_alone(name, count, platform):
    o = platform_overrides(Detected(True, count, name), [])
    assert o == [f"platform={platform}", f"platform.gpus_per_node={count}", "platform.nodes=1",
                 "platform.launcher=local", "platform.container.runtime=none", "platform.container.image=null"]


def test_an_unknown_gpu_is_named_and_the_users_platform_wins():
    with pytest.raises(HarnessError, match="no platform in conf/platform/ declares the detected GPU 'Tesla T4'"):
        platform_overrides(Detected(True, 1, "Tesla T4"), [])
    assert platform_overrides(Detected(True, 1, "Tesla T4"), ["platform=h100"])[0] == "platform=h100"


@pytest.mark.parametrize("name,count", [("NVIDIA H100 80GB HBM3", 1), ("NVIDIA H200", 1), ("NVIDIA H100 80GB HBM3", 8)])
def test_the_suite_is_nccl_collectives_and_model_1_under_zero_0_to_3_predicted_to_fit(tmp_path, name, count):
    overrides = ["suite=gpu-check", *platform_overrides(Detected(True, count, name), []), f"out={tmp_path}"]
    _, planned = plan_suite(overrides)
    coll = [p for p in planned if p.cfg.kind == RunKind.collective]
    train = [p for p in planned if p.cfg.kind == RunKind.training]
    assert len(coll) == 1 and coll[0].cfg.platform.dist_backend == "nccl" and coll[0].run.num_ranks == count
    assert set(coll[0].run.spec.ops) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                         "reduce", "sendrecv"}
    assert [(p.cfg.zero.stage, p.cfg.workload.compile.value, p.cfg.workload.name) for p in train] == [
        (0, "none", "llama-440m"), (1, "none", "llama-440m"), (2, "none", "llama-440m"), (3, "none", "llama-440m"),
        (1, "torch", "llama-440m"), (3, "deepcompile", "llama-440m"), (1, "none", "llama-440m-kd")]
    for p in train:
        w = p.cfg.workload
        assert (w.seq_len, w.samples_per_step, w.micro_batch_size, w.activation_checkpointing) == (128, 1024, 128, False)
        assert p.run.num_ranks == count and p.cfg.platform.container.runtime.value == "none"
        from harness.model.memory import memory_estimate
        est = memory_estimate(p.cfg)
        assert est.fits


def test_the_distillation_run_is_z1s_student_from_a_larger_teacher_and_fits_80_gb_with_margin(tmp_path):
    from harness.config.teacher import teacher_workload
    from harness.model.flops import llama_param_count
    from harness.model.memory import memory_estimate

    _, planned = plan_suite(["suite=gpu-check", *platform_overrides(Detected(True, 1, "NVIDIA H100 80GB HBM3"), []),
                             f"out={tmp_path}"])
    by = {p.run.name: p for p in planned}
    kd, z1 = by["kd"], by["z1"]
    assert kd.run.spec.distill is not None and z1.run.spec.distill is None
    student = {k: v for k, v in vars(kd.cfg.workload).items() if k not in ("name", "distill")}
    assert student == {k: v for k, v in vars(z1.cfg.workload).items() if k not in ("name", "distill")}
    assert kd.cfg.zero.stage == z1.cfg.zero.stage == 1
    teacher = teacher_workload(kd.cfg.workload)
    assert llama_param_count(teacher) == 1_100_048_384 > llama_param_count(kd.cfg.workload)   # TinyLlama-1.1B's shape
    assert teacher.vocab_size == kd.cfg.workload.vocab_size
    est, twin = memory_estimate(kd.cfg), memory_estimate(z1.cfg)
    assert est.teacher_gib == pytest.approx(2.05 + 0.98, abs=0.01)      # bf16 parameters + the teacher's logits
    assert est.total_gib == pytest.approx(35.97, abs=0.01) and twin.total_gib == pytest.approx(34.12, abs=0.01)
    assert est.total_gib < 0.6 * est.capacity_gib                      # margin: 36 of 70.1 GiB usable
    assert kd.run.spec.steps <= 3                              # gpu-check's time on one H100 stays bounded


def test_the_kd_suite_the_node_script_runs_is_gpu_checks_z1_and_kd_as_they_are_there():
    from harness.config.compose import compose
    full, kd = (compose([f"suite={name}"]).suite for name in ("gpu-check", "gpu-check-kd"))
    assert [(r.name, r.kind, r.overrides) for r in kd.runs] == \
           [(r.name, r.kind, r.overrides) for r in full.runs if r.name in ("z1", "kd")]


def _training(run_id, status="ok", samples=100.0, mfu=41.0, peak=30.0, overhead=2.0, **more):
    return {"run_id": run_id, "status": status, "reason": None, "benchmark": "llama-440m",
            "metrics": {"samples_per_s": {"value": samples}, "mfu_pct": {"value": mfu},
                        "peak_mem_gib": {"value": peak}, "instrumentation_overhead_pct": {"value": overhead},
                        **{k: {"value": v} for k, v in more.items()}}}


def test_the_summary_puts_the_predicted_peak_beside_the_measured_and_the_plain_loop_ratio(tmp_path):
    _, planned = plan_suite(["suite=gpu-check", *platform_overrides(Detected(True, 1, "NVIDIA H100 80GB HBM3"), []),
                             f"out={tmp_path}"])
    ids = {p.run.name: p.run.record_ids()[0] for p in planned}
    smoke_rows = [{"size_bytes": 1024, "out_of_place": {"time_us": 5.0, "algbw_gbps": None, "busbw_gbps": None,
                                                        "num_wrong": 0}, "in_place": None}]
    records = {ids["nccl"]: {"run_id": ids["nccl"], "status": "ok", "benchmark": "all_reduce", "rows": None,
                             "metrics": {}, "smoke": {"reason": "one rank", "rows": smoke_rows}},
               ids["z0"]: _training(ids["z0"]), ids["z2"]: _training(ids["z2"], samples=98.0),
               ids["z3"]: _training(ids["z3"], status="oom")}
    records = dict(zip(records, typed(list(records.values()))))
    loaded = {"setting": "its harness run's caches", "fx_graph": {"hit": 2, "miss": 0, "bypass": 0},
              "aot_autograd": {"hit": 1, "miss": 0, "bypass": 0}}   # the compiled bare loop loads what z1-compile compiled
    s = summarise(records, planned, "h100", "1 x NVIDIA H100 80GB HBM3", {
        "z2": {"ok": True, "samples_per_s": 100.0}, "z1-compile": {"ok": True, "samples_per_s": 50.0, "compile_cache": loaded}})
    assert [t["zero"] for t in s.training] == [0, 2, 3]
    z0 = s.training[0]
    assert z0["predicted_peak_gib"] == pytest.approx(33.2, abs=0.1)
    assert z0["peak_error_pct"] == pytest.approx(100 * (z0["predicted_peak_gib"] - 30.0) / 30.0)
    assert s.collectives == [{"op": "all_reduce", "status": "ok", "smoke": True, "sizes": 1, "num_wrong": 0,
                              "avg_busbw_gbps": None}]
    assert s.plain[0]["harness_over_plain"] == pytest.approx(0.98)
    text = markdown(s)
    assert "smoke: one rank, no bandwidth" in text and "0.980 x a bare DeepSpeed loop" in text
    assert "(100.0 samples/s)" in text and "(50.0 samples/s; its harness run's caches: 2 of 2 graphs from the cache)" in text
    assert "| z3 | 3 | 128 x 8 | oom |" in text


def test_the_distillation_run_is_reported_beside_its_twin_with_both_mfus_and_the_teachers_memory(tmp_path):
    _, planned = plan_suite(["suite=gpu-check", *platform_overrides(Detected(True, 1, "NVIDIA H100 80GB HBM3"), []),
                             f"out={tmp_path}"])
    ids = {p.run.name: p.run.record_ids()[0] for p in planned}
    sketches = [_training(ids["z1"], samples=711.0, mfu=22.8, peak=33.45),
                _training(ids["kd"], samples=420.0, mfu=13.5, peak=35.30, mfu_with_teacher_pct=24.8, teacher_mem_gib=2.049)]
    records = dict(zip([ids["z1"], ids["kd"]], typed(sketches)))
    s = summarise(records, planned, "h100", "1 x NVIDIA H100 80GB HBM3", None)
    (d,) = s.distillation
    assert (d["run"], d["twin"], d["samples_per_s"], d["twin_samples_per_s"]) == ("kd", "z1", 420.0, 711.0)
    assert (d["mfu_pct"], d["mfu_with_teacher_pct"], d["twin_mfu_pct"], d["teacher_mem_gib"]) == (13.5, 24.8, 22.8, 2.049)
    assert d["predicted_teacher_gib"] == pytest.approx(3.03, abs=0.01)           # the model's: parameters + logits
    assert d["added_peak_gib"] == pytest.approx(35.30 - 33.45)
    assert d["predicted_added_peak_gib"] == pytest.approx(35.97 - 34.12, abs=0.01)
    text = markdown(s)
    assert "| kd | z1 | 420.0 (711.0) | 13.5 | 24.8 | 22.8 | 2.05 | 3.03 | +1.85 (+1.85) |" in text
    assert "MFU+teacher % adds the teacher's forward" in text
    assert "| kd | 1 | 128 x 8 | ok |" in text                                  # and in the runs' table as any run


def test_a_distillation_run_without_its_twin_says_so():
    s = markdown(summarise({}, [], "h100", "1 x H100", None))
    assert "| distilled |" not in s
    from harness.gpu_check import distillation_rows
    row = {"run": "kd", "workload": "llama-440m-kd", "zero": 1, "micro_batch_size": 128, "grad_acc_steps": 8,
           "stack": "eager", "samples_per_s": 1.0, "mfu_pct": 1.0, "mfu_with_teacher_pct": 2.0, "teacher_mem_gib": 1.0,
           "predicted_teacher_gib": 1.5, "peak_mem_gib": 3.0, "predicted_peak_gib": 3.1}
    (d,) = distillation_rows([row, {**row, "run": "z2", "workload": "llama-440m", "zero": 2}])   # another stage: no twin
    assert d["twin"] is None and d["added_peak_gib"] is None and d["predicted_added_peak_gib"] is None


def test_the_cpu_suite_ci_runs_is_the_gpu_check_suite_at_cpu_size():
    from harness.config.compose import compose
    gpu, cpu = (compose([f"suite={name}"]).suite for name in ("gpu-check", "gpu-check-cpu"))
    # DeepCompile: CUDA only. kd: the distillation path runs on cpu in the default cpu suite (llama-tiny-kd) and
    # tests/integration/test_distillation.py; gpu-check's report of it is checked above on sketched records
    cuda_only = [r for r in gpu.runs if "workload.compile=deepcompile" in r.overrides or r.name == "kd"]
    assert [r.name for r in cuda_only] == ["z3-deepcompile", "kd"]
    gpu_runs = [r for r in gpu.runs if r not in cuda_only]
    assert [r.name for r in gpu_runs] == [r.name for r in cpu.runs]
    for g, c in zip(gpu_runs, cpu.runs):
        assert g.kind == c.kind
        assert [o for o in g.overrides if o.startswith(("zero=", "collective=", "workload.compile"))] == \
               [o for o in c.overrides if o.startswith(("zero=", "collective=", "workload.compile"))]


def test_each_graph_break_of_a_compiled_run_is_listed_with_where_it_happened(tmp_path):
    _, planned = plan_suite(["suite=gpu-check", *platform_overrides(Detected(True, 1, "NVIDIA H100 80GB HBM3"), []),
                             f"out={tmp_path}"])
    ids = {p.run.name: p.run.record_ids()[0] for p in planned}
    site = ("deepspeed/accelerator/cuda_accelerator.py:89 in synchronize <- deepspeed/utils/timer.py:238 in start <- "
            "deepspeed/runtime/engine.py:2946 in _forward_prologue")
    watch = {"graph_breaks": 1, "graph_break_reasons": [
        {"reason": "Attempted to call function marked as skipped -- the function `synchronize`", "count": 1, "where": [site]}]}
    compiled = {**_training(ids["z1-compile"], samples=1229.2, graph_breaks=1, recompiles=0),
                "environment": {"stack": {"compile": "torch", "compile_watch": watch, "attention_used": ["cudnn"]}}}
    compiled["metrics"]["compile_s"] = {"value": 48.9, "cache": "cold: 4 graphs compiled"}
    records = dict(zip([ids["z1-compile"]], typed([compiled])))
    text = markdown(summarise(records, planned, "h100", "1 x NVIDIA H100 80GB HBM3", None))
    assert "| z1-compile | torch | 48.9 | cold: 4 graphs compiled | 1 | 0 | cudnn |" in text
    assert (f"- z1-compile: graph break x1: Attempted to call function marked as skipped -- the function `synchronize` "
            f"(at {site})") in text
