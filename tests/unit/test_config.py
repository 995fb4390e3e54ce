"""Composition and validation of the Hydra config tree (harness.config), as a user drives it:
override lists in, a validated BenchConfig or one ConfigError message out."""
from __future__ import annotations

import pytest
import yaml
from unit_helpers import CONF_DIR, options

from harness.config.compose import compose
from harness.errors import ConfigError


def declared(group: str, option: str) -> dict:
    """What conf/<group>/<option>.yaml declares, over the options of its group it builds on
    (a `-kd` workload extends its student's file); schemas and _self_ are not options."""
    data = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text(encoding="utf-8"))
    merged: dict = {}
    for base in data.pop("defaults", None) or []:
        if isinstance(base, str) and base in options(group):
            merged.update(declared(group, base))
    return {**merged, **data}


SLURM_PLATFORMS = [p for p in options("platform") if declared("platform", p).get("launcher") == "slurm"]
GPU_CLUSTERS = [p for p in SLURM_PLATFORMS if declared("platform", p).get("device", "cuda") == "cuda"]
GRID = [(p, w) for p in options("platform") for w in options("workload")]


def test_the_grid_covers_every_platform_and_workload():
    # The table below is generated from conf/; make sure it is not silently empty.
    assert {"cpu", "h100", "h200", "ib-a100", "roce-a100", "roce-h100"} <= set(options("platform"))
    assert {"llama-tiny", "llama-440m", "llama-8b"} <= set(options("workload"))
    assert SLURM_PLATFORMS, "expected at least one multi-node (slurm) platform"


def grid_overrides(platform: str, workload: str) -> list[str]:
    extra = ["platform.launcher=local", "platform.nodes=1"] if platform in SLURM_PLATFORMS else []
    return [f"platform={platform}", f"workload={workload}", *extra]


@pytest.mark.parametrize("platform,workload", GRID, ids=[f"{p}-x-{w}" for p, w in GRID])
def test_every_platform_composes_with_every_workload(composed, platform, workload):
    cfg = composed(grid_overrides(platform, workload))
    p, w = declared("platform", platform), declared("workload", workload)

    assert cfg.platform.name == platform
    assert cfg.workload.name == workload
    assert cfg.suite.name == f"default-{platform}"  # the default suite follows the platform
    assert cfg.zero.stage == 1
    for key in ("gpus_per_node", "gpu_model", "mem_per_device_gib"):
        assert getattr(cfg.platform, key) == p[key], key
    assert cfg.platform.device.value == p["device"]
    assert cfg.platform.fabric.value == p["fabric"]
    assert dict(cfg.platform.peak_tflops) == p["peak_tflops"]

    precision = w.get("precision", "bf16")
    assert cfg.workload.precision.value == precision
    assert cfg.platform.peak_tflops[precision] > 0, "MFU needs a declared peak for the workload's dtype"

    nodes = 1 if platform in SLURM_PLATFORMS else p["nodes"]
    assert cfg.platform.nodes == nodes
    assert cfg.platform.world_size == p["gpus_per_node"] * nodes
    assert cfg.platform.dist_backend == ("gloo" if p["device"] == "cpu" else "nccl")

    assert cfg.workload.micro_batch_size == w["micro_batch_size"]
    assert cfg.workload.grad_acc_steps == w["samples_per_step"] // w["micro_batch_size"]
    assert cfg.workload.micro_batch_size * cfg.workload.grad_acc_steps == w["samples_per_step"]
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "seq_len"):
        assert getattr(cfg.workload, key) == w[key], key


@pytest.mark.parametrize("platform", GPU_CLUSTERS)
def test_slurm_platforms_compose_multi_node_in_their_image(platform):
    cfg = compose([f"platform={platform}"])
    assert cfg.platform.launcher.value == "slurm"
    assert cfg.platform.nodes == declared("platform", platform)["nodes"] > 1
    assert cfg.platform.container.runtime.value == "apptainer"
    assert cfg.platform.container.image.endswith(".sif")
    assert cfg.platform.slurm.exclusive


def test_local_launcher_runs_one_node_only():
    platform = GPU_CLUSTERS[0]
    with pytest.raises(ConfigError) as err:
        compose([f"platform={platform}", "platform.launcher=local"])
    msg = str(err.value)
    assert f"platform.nodes={declared('platform', platform)['nodes']}" in msg
    assert "nodes=1" in msg


# --- the default composition: no overrides at all -------------------------------------------

@pytest.fixture(scope="module")
def default_suite():
    from harness.bench import plan_suite

    return plan_suite([])


def test_default_composition_is_the_cpu_suite_collectives_six_llama_tiny_runs_and_one_distillation(default_suite):
    _, all_planned = default_suite
    assert len(all_planned) == 8
    collectives, *planned, kd = all_planned
    assert collectives.cfg.kind.value == "collective" and collectives.run.spec.kind == "collective"
    assert collectives.cfg.collective.name == "cpu-short"
    assert {"all_reduce", "all_gather", "reduce_scatter"} <= set(collectives.run.spec.ops)
    for p in planned + [kd]:
        assert p.cfg.suite.name == "default-cpu"
        assert len(p.cfg.suite.runs) == 8
        assert p.cfg.platform.name == "cpu"
        assert p.cfg.kind.value == "training"
        assert p.run.num_ranks == 2
    assert {p.cfg.workload.name for p in planned} == {"llama-tiny"}
    assert all(p.run.spec.distill is None for p in planned)
    assert kd.cfg.workload.name == "llama-tiny-kd"
    assert kd.cfg.zero.stage == 3
    assert kd.run.spec.distill is not None and kd.run.spec.distill.teacher_checkpoint is None
    assert [p.run.run_id for p in all_planned] == [
        "00-collectives", "01-z1-mb2-ga4", "02-z1-mb4-ga2", "03-z2-mb2-ga4", "04-z2-mb4-ga2",
        "05-z3-mb2-ga4", "06-z3-mb4-ga2", "07-kd-z3-mb4-ga2"]


def test_default_suite_spans_zero_1_2_3_at_one_c_with_two_splits(default_suite):
    _, planned = default_suite
    planned = [p for p in planned if p.cfg.kind.value == "training" and p.cfg.workload.distill is None]
    w = [p.cfg.workload for p in planned]
    assert {p.cfg.zero.stage for p in planned} == {1, 2, 3}
    assert len({x.samples_per_step for x in w}) == 1, "every run must be at the same C"
    assert all(x.micro_batch_size * x.grad_acc_steps == x.samples_per_step for x in w)
    splits = {(x.micro_batch_size, x.grad_acc_steps) for x in w}
    assert len(splits) >= 2
    assert min(x.grad_acc_steps for x in w) >= 2, "grad-acc >= 2 everywhere"
    # every ZeRO stage is measured at every split
    assert {(p.cfg.zero.stage, p.cfg.workload.micro_batch_size) for p in planned} == {
        (s, mb) for s in (1, 2, 3) for mb, _ in splits}


def test_default_suite_zero3_runs_really_all_gather_the_tiny_model(default_suite):
    _, planned = default_suite
    for p in planned[1:]:  # the first run is the collective sweep
        zero = p.run.spec.deepspeed["zero_optimization"]
        assert zero["stage"] == p.cfg.zero.stage
        if p.cfg.zero.stage == 3:
            assert zero["stage3_param_persistence_threshold"] == 0
        else:
            assert "stage3_param_persistence_threshold" not in zero


def test_default_suite_records_each_runs_overrides(default_suite):
    _, planned = default_suite
    assert planned[0].run.overrides == ["kind=collective", "collective=cpu-short"]
    for p in planned[1:]:
        assert f"workload={p.cfg.workload.name}" in p.run.overrides
        assert f"zero=stage{p.cfg.zero.stage}" in p.run.overrides
        assert f"workload.micro_batch_size={p.cfg.workload.micro_batch_size}" in p.run.overrides


# --- the paper suites: every published cell, with the workload the figures measured ---------

PAPER = CONF_DIR.parent / "reference_results" / "sources" / "sc25-pmbs"
PAPER_PLATFORMS = ("ib-a100", "roce-a100", "roce-h100")


def published_grid(csv_name: str, platform: str) -> set[tuple[int, int, int]]:
    """(ZeRO stage, micro-batch, grad-acc) of every published cell of a platform, OOM cells included."""
    import csv

    with open(PAPER / csv_name, newline="", encoding="utf-8") as f:
        return {(int(r["zero_stage"]), int(r["batch_size"]), int(r["grad_acc"]))
                for r in csv.DictReader(f) if r["platform"] == platform}


def training_grid(planned) -> set[tuple[int, int, int]]:
    return {(p.cfg.zero.stage, p.cfg.workload.micro_batch_size, p.cfg.workload.grad_acc_steps)
            for p in planned if p.cfg.kind.value == "training"}


@pytest.mark.parametrize("suite,workload,csv_name,platforms", [
    ("paper-model1", "llama-440m", "model1_ib-a100_batch_time.csv", ("ib-a100",)),
    ("paper-model2", "llama-8b-kd", "model2_step2_parallelism.csv", PAPER_PLATFORMS),
])
def test_a_paper_suite_runs_every_published_cell_oom_cells_included_after_the_collectives(
        suite, workload, csv_name, platforms):
    from harness.bench import plan_suite

    _, planned = plan_suite([f"platform={platforms[0]}", f"suite={suite}"])
    assert planned[0].cfg.kind.value == "collective" and planned[0].cfg.collective.name == "main"
    grid = training_grid(planned)
    assert len(grid) == len(planned) - 1, "one run per cell"
    for platform in platforms:  # the published grid is the same on every platform
        assert grid == published_grid(csv_name, platform)
    for p in planned[1:]:
        w = p.cfg.workload
        assert w.name == workload and w.micro_batch_size * w.grad_acc_steps == w.samples_per_step
        assert p.cfg.platform.nodes == 2 and p.run.num_ranks == 16  # the paper's 2 nodes x 8 GPUs
        # the workload the published figures measured (inferred from them: reference_results/README.md)
        assert (w.seq_len, w.activation_checkpointing) == ((128, False) if suite == "paper-model1" else (128, True))
    if suite == "paper-model1":
        assert 3 not in {s for s, _, _ in grid}, "the paper has no ZeRO-3 Model 1 figure"
        assert {mb for _, mb, _ in grid} == {32, 64, 128, 256, 512}


@pytest.mark.parametrize("platform", PAPER_PLATFORMS)
def test_the_paper_platforms_default_and_nightly_suites_are_the_model1_cells_then_compiled(platform):
    runs = {name: [(r.name, r.kind.value, list(r.overrides)) for r in compose([f"platform={platform}", f"suite={name}"]).suite.runs]
            for name in ("paper-model1", f"default-{platform}", f"nightly-{platform}")}
    assert runs[f"default-{platform}"] == runs[f"nightly-{platform}"]
    paper, compiled = runs[f"default-{platform}"][:len(runs["paper-model1"])], runs[f"default-{platform}"][len(runs["paper-model1"]):]
    assert paper == runs["paper-model1"]            # the paper's eager cells, as published, stay
    assert [(name, [o for o in ov if "compile" in o or "zero=" in o]) for name, _, ov in compiled] == [
        ("z1-mb128-ga8-compile", ["zero=stage1", "workload.compile=torch"]),
        ("z2-mb128-ga8-compile", ["zero=stage2", "workload.compile=torch"])]
    assert compose([f"platform={platform}"]).suite.name == f"default-{platform}"


def test_only_the_distillation_8b_carries_the_papers_inferred_model2_workload(composed):
    """llama-8b-kd is compared with the published Model 2 figures; llama-8b is compared with none."""
    kd, plain = composed(["workload=llama-8b-kd"]).workload, composed(["workload=llama-8b"]).workload
    assert (kd.seq_len, kd.activation_checkpointing) == (128, True)
    assert (plain.seq_len, plain.activation_checkpointing) == (512, False)


# --- validation errors --------------------------------------------------------------------

# (overrides, field named, bad value as shown, what is valid: fragments that must all appear)
BAD_VALUES = [
    pytest.param(["zero.stage=5"], "zero.stage", "5", ["0, 1, 2, 3"], id="zero.stage=5"),
    pytest.param(["workload.micro_batch_size=3"], "workload.micro_batch_size", "3",
                 ["samples_per_step", "8", "[1, 2, 4, 8]"], id="micro_batch_size=3"),
    pytest.param(["workload.grad_acc_steps=3"], "workload.grad_acc_steps", "3",
                 ["samples_per_step", "8", "must be 4"], id="grad_acc_steps=3"),
    pytest.param(["zero=stage9"], "zero", "stage9",
                 ["valid zero options: " + ", ".join(options("zero"))], id="zero=stage9"),
    pytest.param(["platform=nope"], "platform", "nope",
                 ["valid platform options: " + ", ".join(options("platform"))], id="platform=nope"),
    pytest.param(["workload.hidden_size=abc"], "workload.hidden_size", "abc", ["integer"],
                 id="hidden_size=abc"),
    pytest.param(["workload.precision=int8"], "workload.precision", "int8", ["fp32", "bf16", "fp16"],
                 id="precision=int8"),
    pytest.param(["measure.steps=0"], "measure.steps", "0", [">= 1"], id="steps=0"),
    pytest.param(["measure.timeout_s=-1"], "measure.timeout_s", "-1", ["positive"], id="timeout_s=-1"),
    pytest.param(["measure.inject_delay_rank=2"], "measure.inject_delay_rank", "2", ["a rank in 0..1"],
                 id="straggler-beyond-the-ranks"),
    pytest.param(["measure.inject_delay_node=1"], "measure.inject_delay_node", "1", ["a node in 0..0"],
                 id="slow-node-beyond-the-nodes"),
    pytest.param(["measure.inject_delay_node=0", "measure.inject_delay_rank=1"], "measure.inject_delay_node", "0",
                 ["set one of them"], id="slow-node-and-straggler-rank"),
    pytest.param(["workload.num_kv_heads=3"], "workload.num_kv_heads", "3", ["divide num_heads=4"],
                 id="num_kv_heads=3"),
    pytest.param(["data.source=corpus"], "data.corpus_path", "None",
                 ["data.source=corpus", "existing local file"], id="corpus-without-paths"),
    pytest.param(["deepspeed_config=/nonexistent.json"], "deepspeed_config", "/nonexistent.json",
                 ["existing", "JSON file"], id="deepspeed_config-missing"),
    pytest.param(["+platform.nccl_env.FOO=1"], "platform.nccl_env", "FOO", ["NCCL_"],
                 id="nccl_env-non-NCCL-key"),
    pytest.param(["workload.precision=fp16"], "workload.precision", "fp16", ["fp32", "bf16"],
                 id="fp16-on-cpu"),
    pytest.param(["+platform.peak_tflops.fp16=1.0", "workload.precision=fp16"], "workload.precision",
                 "fp16", ["needs a GPU", "fp32 or bf16"], id="fp16-on-cpu-with-peak"),
]


@pytest.mark.parametrize("overrides,field,value,valid", BAD_VALUES)
def test_bad_value_is_a_config_error_naming_field_value_and_what_is_valid(overrides, field, value, valid):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    msg = str(err.value)
    assert field in msg
    assert value in msg
    for fragment in valid:
        assert fragment.lower() in msg.lower(), f"{fragment!r} missing from: {msg}"
    assert "Traceback" not in msg


def test_a_bad_suite_run_stops_planning_and_names_the_run():
    from harness.bench import plan_suite
    from harness.errors import HarnessError

    # C = 6: the default suite's mb 2 runs are fine, its first mb 4 run (z1-mb4-ga2) is not
    with pytest.raises(HarnessError) as err:
        plan_suite(["workload.samples_per_step=6"])
    msg = str(err.value)
    assert "suite default-cpu, run z1-mb4-ga2" in msg
    assert "workload.micro_batch_size=4" in msg
    assert "[1, 2, 3, 6]" in msg


def test_validation_changes_nothing_and_resolution_works_on_a_copy():
    import copy

    from harness.config.validate import resolve, validate

    cfg = compose(["workload=llama-tiny", "workload.micro_batch_size=2", "+nccl_env={NCCL_DEBUG: WARN}"])
    before = copy.deepcopy(cfg)
    validate(cfg)
    assert cfg == before
    raw = copy.deepcopy(cfg)
    raw.workload.grad_acc_steps = 0
    raw.platform.nccl_env = {"NCCL_BUFFSIZE": 4194304}
    resolved = resolve(raw)
    assert resolved.workload.grad_acc_steps == cfg.workload.samples_per_step // 2
    assert resolved.platform.nccl_env == {"NCCL_BUFFSIZE": "4194304"}
    assert raw.workload.grad_acc_steps == 0 and raw.platform.nccl_env == {"NCCL_BUFFSIZE": 4194304}
