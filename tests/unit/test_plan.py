"""Planning (harness.plan): the generated DeepSpeed JSON, merging a user's DeepSpeed file, the
RunSpec of a run and how suite overrides combine with the command line's."""
from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import re
import sys
import warnings

import pytest
from unit_helpers import REPO_ROOT

from contract.fingerprint import DIGEST_VAR, IMAGE_VAR
from contract.spec import TrainSpec
from harness.bench import plan_suite
from harness.config.choices import Precision
from harness.config.compose import compose
from harness.errors import ConfigError, HarnessError
from harness.launch.container import ImageDigests
from harness.plan import deepspeed_config, merge_overrides, merge_user_deepspeed, plan_run

CACHE = REPO_ROOT / ".cache"


# --- deepspeed_config ----------------------------------------------------------------------

@pytest.mark.parametrize("stage,precision", [
    (0, "fp32"), (1, "fp32"), (2, "fp32"), (3, "fp32"), (1, "bf16"), (2, "bf16"), (3, "bf16")])
def test_generated_deepspeed_config_per_stage_and_precision(tiny_cfg, stage, precision):
    tiny_cfg.zero.stage = stage
    tiny_cfg.workload.precision = Precision(precision)
    ds = deepspeed_config(tiny_cfg)

    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == 2 * 4 * 2
    assert ds["gradient_clipping"] == 1.0
    # unset (None) ZeRO knobs are not emitted: DeepSpeed's own defaults apply
    assert ds["zero_optimization"] == {"stage": stage}
    if precision == "bf16":
        assert ds["bf16"] == {"enabled": True}
    else:
        assert "bf16" not in ds
    assert "fp16" not in ds
    assert "optimizer" not in ds  # workload.optimizer=torch: a client optimizer
    json.dumps(ds, allow_nan=False)  # what the ranks receive is plain JSON


@pytest.mark.parametrize("mb,gpus_per_node,nodes,expected_tbs", [
    (2, 2, 1, 16), (4, 2, 1, 16), (1, 8, 1, 64), (8, 8, 2, 128)])
def test_train_batch_size_is_mb_x_ga_x_world(tiny_cfg, mb, gpus_per_node, nodes, expected_tbs):
    tiny_cfg.workload.micro_batch_size = mb
    tiny_cfg.workload.grad_acc_steps = 8 // mb
    tiny_cfg.platform.gpus_per_node = gpus_per_node
    tiny_cfg.platform.nodes = nodes
    ds = deepspeed_config(tiny_cfg)
    assert ds["train_batch_size"] == expected_tbs
    assert ds["train_micro_batch_size_per_gpu"] == mb
    assert ds["gradient_accumulation_steps"] == 8 // mb


def test_set_zero_knobs_are_emitted_even_when_falsy(tiny_cfg):
    tiny_cfg.zero.stage = 3
    tiny_cfg.zero.overlap_comm = False
    tiny_cfg.zero.stage3_param_persistence_threshold = 0
    tiny_cfg.zero.reduce_bucket_size = 5_000_000
    assert deepspeed_config(tiny_cfg)["zero_optimization"] == {
        "stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0,
        "reduce_bucket_size": 5_000_000}


def test_deepspeed_optimizer_section_only_for_deepspeed_adamw(tiny_cfg):
    from harness.config.choices import OptimizerImpl

    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    opt = deepspeed_config(tiny_cfg)["optimizer"]
    assert opt["type"] == "AdamW"
    assert opt["params"] == {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}


# --- merge_user_deepspeed ------------------------------------------------------------------

@pytest.fixture
def generated(tiny_cfg):
    tiny_cfg.workload.precision = Precision.bf16
    tiny_cfg.zero.overlap_comm = True
    return deepspeed_config(tiny_cfg)  # stage 1, mb 2, ga 4, 2 ranks, bf16, overlap_comm


def test_user_only_keys_are_merged_in(generated):
    user = {"activation_checkpointing": {"partition_activations": True, "number_checkpoints": 2},
            "zero_optimization": {"contiguous_gradients": False},
            "communication_data_type": "fp32"}
    before = copy.deepcopy(generated)
    merged = merge_user_deepspeed(generated, user, "user.json")
    assert merged["activation_checkpointing"] == user["activation_checkpointing"]
    assert merged["communication_data_type"] == "fp32"
    assert merged["zero_optimization"] == {"stage": 1, "overlap_comm": True, "contiguous_gradients": False}
    assert merged["train_batch_size"] == 16
    assert generated == before, "the generated config must not be modified"


def test_equal_values_are_not_conflicts(generated):
    user = {"zero_optimization": {"stage": 1, "overlap_comm": True}, "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 4, "train_batch_size": 16, "gradient_clipping": 1,
            "bf16": {"enabled": True}, "steps_per_print": 1}
    merged = merge_user_deepspeed(generated, user, "user.json")
    assert merged["zero_optimization"]["stage"] == 1
    assert merged["steps_per_print"] == 1  # the suite's logging knobs may be changed


@pytest.mark.parametrize("user,key,use_instead", [
    ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage=3", "zero.stage"),
    ({"train_micro_batch_size_per_gpu": 4}, "train_micro_batch_size_per_gpu=4", "workload.micro_batch_size"),
    ({"gradient_accumulation_steps": 8}, "gradient_accumulation_steps=8", "workload.grad_acc_steps"),
    ({"train_batch_size": 64}, "train_batch_size=64", "workload.micro_batch_size"),
    ({"gradient_clipping": 0.5}, "gradient_clipping=0.5", "workload.grad_clip"),
    ({"zero_optimization": {"overlap_comm": False}}, "zero_optimization.overlap_comm=False",
     "zero.overlap_comm"),
    ({"bf16": {"enabled": False}}, "bf16.enabled=False", "workload.precision"),
])
def test_conflicting_user_value_names_the_key_and_the_field_to_set(generated, user, key, use_instead):
    with pytest.raises(ConfigError) as err:
        merge_user_deepspeed(generated, user, "my_ds.json")
    msg = str(err.value)
    assert "my_ds.json" in msg
    assert key in msg
    assert f"set {use_instead}" in msg


@pytest.mark.parametrize("precision,user", [
    ("fp32", {"bf16": {"enabled": True}}),
    ("bf16", {"fp16": {"enabled": True}}),
])
def test_user_file_cannot_switch_precision_behind_the_suites_back(tiny_cfg, precision, user):
    tiny_cfg.workload.precision = Precision(precision)
    with pytest.raises(ConfigError, match="workload.precision"):
        merge_user_deepspeed(deepspeed_config(tiny_cfg), user, "my_ds.json")


# --- plan_run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def user_ds_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "user_ds.json"
    path.write_text(json.dumps({"activation_checkpointing": {"partition_activations": True},
                                "zero_optimization": {"stage": 1}}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def cfg_with_user_ds(user_ds_file):
    return compose([f"deepspeed_config={user_ds_file}", "suite=single"])


def test_user_deepspeed_file_ends_up_in_the_run_config_and_spec(cfg_with_user_ds, user_ds_file, tmp_path):
    assert cfg_with_user_ds.deepspeed_config == str(user_ds_file)
    run = plan_run(cfg_with_user_ds, "mine", 0, [f"deepspeed_config={user_ds_file}"], tmp_path,
                   REPO_ROOT, CACHE)
    for ds in (run.config["deepspeed"], run.spec.deepspeed):
        assert ds["activation_checkpointing"] == {"partition_activations": True}
        assert ds["zero_optimization"]["stage"] == 1
        assert ds["train_batch_size"] == 16
    assert run.config["deepspeed_config"] == str(user_ds_file)
    assert run.overrides == [f"deepspeed_config={user_ds_file}"]


@pytest.mark.parametrize("content,expected", [
    ('{"zero_optimization": {"stage": 2}}', "zero_optimization.stage=2"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"zero_optimization": ', "not a readable JSON file"),
])
def test_bad_user_deepspeed_file_stops_planning(cfg_with_user_ds, tmp_path, content, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")
    cfg = copy.deepcopy(cfg_with_user_ds)
    cfg.deepspeed_config = str(bad)
    with pytest.raises(ConfigError) as err:
        plan_run(cfg, "mine", 0, [], tmp_path, REPO_ROOT, CACHE)
    assert expected in str(err.value)
    assert str(bad) in str(err.value)


def test_plan_run_describes_the_launch_without_touching_the_disk(tiny_cfg, tmp_path):
    tiny_cfg.platform.nccl_env = {"NCCL_DEBUG": "INFO"}
    run = plan_run(tiny_cfg, "z1 mb2/ga4", 3, ["zero=stage1"], tmp_path / "out", REPO_ROOT, CACHE)
    assert run.run_id == "03-z1-mb2-ga4"
    assert run.run_dir == tmp_path / "out" / "runs" / "03-z1-mb2-ga4"
    assert not (tmp_path / "out").exists()
    assert run.num_ranks == 2
    assert run.timeout_s == 900.0
    assert run.argv == [sys.executable, "-m", "benchmarks.training.train", "--run-dir", str(run.run_dir)]
    assert run.env["DS_ACCELERATOR"] == "cpu"
    assert run.env["CUDA_VISIBLE_DEVICES"] == ""
    assert run.env["NCCL_DEBUG"] == "INFO"
    assert run.env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
    assert "suite" not in run.config
    assert run.config["workload"]["grad_acc_steps"] == 4
    assert run.config["workload"]["precision"] == "fp32"  # enums as their values
    assert run.spec.run_id == run.run_id
    assert run.spec.dist_backend == "gloo"
    assert (run.spec.micro_batch_size, run.spec.grad_acc_steps) == (2, 4)


def test_train_spec_round_trips_through_json(tiny_cfg, tmp_path):
    spec = plan_run(tiny_cfg, "x", 0, [], tmp_path, REPO_ROOT, CACHE).spec
    assert TrainSpec.from_dict(json.loads(spec.to_json())) == spec


# --- merge_overrides -----------------------------------------------------------------------

@pytest.mark.parametrize("base,run,expected,replaced", [
    ([], ["zero=stage2"], ["zero=stage2"], []),
    (["measure.steps=3"], ["zero=stage2"], ["measure.steps=3", "zero=stage2"], []),
    (["workload.micro_batch_size=4", "measure.steps=3"], ["workload=llama-tiny", "workload.micro_batch_size=2"],
     ["measure.steps=3", "workload=llama-tiny", "workload.micro_batch_size=2"], ["workload.micro_batch_size"]),
    (["zero=stage3"], ["zero=stage1"], ["zero=stage1"], ["zero"]),
    (["+platform.nccl_env.NCCL_DEBUG=INFO"], ["platform.nccl_env.NCCL_DEBUG=WARN"],
     ["platform.nccl_env.NCCL_DEBUG=WARN"], ["platform.nccl_env.NCCL_DEBUG"]),
])
def test_run_overrides_replace_the_same_key_from_the_command_line(base, run, expected, replaced):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert merge_overrides(base, run) == expected
    if replaced:
        assert len(caught) == 1
        msg = str(caught[0].message)
        for key in replaced:
            assert key in msg
        assert "no effect" in msg
    else:
        assert caught == []


@pytest.mark.parametrize("base,run", [
    (["zero.overlap_comm=true"], ["zero=stage1"]),
    (["zero.stage=2"], ["zero=stage1", "workload.micro_batch_size=2"]),
])
def test_a_command_line_field_inside_a_group_the_run_selects_is_kept_and_warned(base, run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert merge_overrides(base, run) == base + run
    assert len(caught) == 1
    assert base[0] in str(caught[0].message) and "on top" in str(caught[0].message)


def test_ranks_keep_the_callers_pythonpath_after_the_repository(composed, tmp_path, monkeypatch):
    """Packages on the caller's PYTHONPATH (module load, pip --target) reach the ranks: the
    repository first, then the caller's entries; inside a container image, the repository only."""
    from harness.plan import rank_env

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site-a", "", "/opt/site-b"]))
    cfg = composed(["platform=cpu"])
    assert rank_env(cfg, REPO_ROOT, tmp_path)["PYTHONPATH"] == os.pathsep.join([str(REPO_ROOT), "/opt/site-a", "/opt/site-b"])
    monkeypatch.delenv("PYTHONPATH")
    assert rank_env(cfg, REPO_ROOT, tmp_path)["PYTHONPATH"] == str(REPO_ROOT)


# --- container images: checked and their digest known while planning ---------------------------

def _sif(tmp_path):
    sif = tmp_path / "bench.sif"
    sif.write_bytes(b"not really an image" * 1000)
    return sif, "sha256:" + hashlib.sha256(sif.read_bytes()).hexdigest()


def test_a_planned_containerised_run_already_holds_its_images_digest(composed, tmp_path):
    """The RunSpec is final when planned: the image was checked and its digest is in the ranks'
    environment (it used to be patched in afterwards, by bench.prepare_container)."""
    sif, digest = _sif(tmp_path)
    cfg = composed(["platform=roce-h100", f"platform.container.image={sif}"])
    run = plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, CACHE, ImageDigests(tmp_path / "cache"))
    assert run.env[IMAGE_VAR] == str(sif) and run.env[DIGEST_VAR] == digest
    # without an image check (`plan`, collect's re-planning) nothing is looked at: no digest
    assert DIGEST_VAR not in plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, CACHE).env


def test_every_run_of_a_suite_is_planned_with_the_digest(composed, tmp_path):
    sif, digest = _sif(tmp_path)
    overrides = ["platform=roce-h100", f"platform.container.image={sif}", f"out={tmp_path / 'out'}"]
    _, planned = plan_suite(overrides, images=ImageDigests(tmp_path / "cache"))
    assert len(planned) > 1 and all(p.run.env[DIGEST_VAR] == digest for p in planned)
    _, unchecked = plan_suite(overrides)
    assert not any(DIGEST_VAR in p.run.env for p in unchecked)


def test_a_missing_image_stops_planning_but_is_a_note_in_a_dry_run(composed, tmp_path, capsys):
    cfg = composed(["platform=roce-h100", f"platform.container.image={tmp_path / 'missing.sif'}"])
    with pytest.raises(HarnessError, match="no image at"):
        plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, CACHE, ImageDigests(tmp_path / "cache"))
    images = ImageDigests(tmp_path / "cache", dry_run=True)
    runs = [plan_run(cfg, f"x{i}", i, [], tmp_path / "out", REPO_ROOT, CACHE, images) for i in range(2)]
    assert capsys.readouterr().out.count("note (dry run): platform.container.image=") == 1, "once per image"
    assert not any(DIGEST_VAR in r.env for r in runs)


def test_no_code_assigns_into_a_planned_runs_environment():
    """Only planning writes a RunSpec's env (rank_env builds it): no `x.env[...] = ...` nor
    `x.env.update(...)` anywhere in the harness."""
    found = []
    for path in sorted((REPO_ROOT / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            hits = [t for t in targets if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)
                    and t.value.attr == "env"]
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("update", "setdefault", "pop", "clear", "__setitem__")
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "env"):
                hits.append(node)
            found += [f"{path.relative_to(REPO_ROOT)}:{n.lineno}" for n in hits]
    assert found == []


def test_only_makes_the_named_runs_of_a_suite_under_their_whole_suite_run_ids(tmp_path):
    """only= picks runs of the suite by name; each keeps the id it has in the whole suite (the
    cluster model's later rounds skip the collective sweep and still pair with the first round's)."""
    out = ["platform=cpu-cluster", "suite=default-cpu-cluster", f"out={tmp_path}"]
    _, whole = plan_suite(out)
    _, part = plan_suite([*out, "only=[z2-mb4-ga2,z3-mb4-ga2]"])
    assert [p.run.run_id for p in part] == [p.run.run_id for p in whole][-2:] == ["02-z2-mb4-ga2", "03-z3-mb4-ga2"]
    assert "only" not in part[0].run.config and part[0].run.config == whole[-2].run.config


@pytest.mark.parametrize("only,says", [
    ("[z9]", "only=['z9'] is invalid: suite default-cpu-cluster has the runs ['collectives', 'z1-mb4-ga2'"),
    ("[z1-mb4-ga2,z9,z8]", "only=['z9', 'z8'] is invalid"),
])
def test_only_refuses_a_run_the_suite_lacks_and_names_those_it_has(tmp_path, only, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        plan_suite(["platform=cpu-cluster", "suite=default-cpu-cluster", f"out={tmp_path}", f"only={only}"])


def test_only_on_a_suite_without_named_runs_says_so(tmp_path):
    with pytest.raises(ConfigError, match="suite single has no named runs"):
        plan_suite(["suite=single", f"out={tmp_path}", "only=[x]"])
