"""The distillation settings and the teacher's local checkpoint are checked before anything
launches: every bad value or mismatched checkpoint is one ConfigError naming what is wrong."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import save_file
from unit_helpers import REPO_ROOT, VENV_PYTHON

from harness.config.compose import compose
from harness.config.teacher import llama_param_shapes, teacher_workload, validate_checkpoint
from harness.errors import ConfigError
from harness.plan import distill_spec

# A small teacher beside llama-tiny (vocab 4096): one layer, hidden 64, so checkpoints are quick.
SMALL_TEACHER = ["workload=llama-tiny-kd", "workload.distill.teacher.hidden_size=64",
                 "workload.distill.teacher.intermediate_size=128", "workload.distill.teacher.num_layers=1"]


@pytest.fixture(scope="module")
def small_teacher():
    return teacher_workload(compose(SMALL_TEACHER).workload)


def write_weights(path, shapes, drop=(), extra=None, change=None):
    tensors = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in shapes.items() if name not in drop}
    tensors.update({k: torch.zeros(v, dtype=torch.bfloat16) for k, v in (extra or {}).items()})
    tensors.update({k: torch.zeros(v, dtype=torch.bfloat16) for k, v in (change or {}).items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def hf_folder(path, w, **config_changes):
    """A Hugging Face style folder: config.json as transformers writes it, weights in safetensors."""
    config = {"model_type": "llama", "vocab_size": w.vocab_size, "hidden_size": w.hidden_size,
              "intermediate_size": w.intermediate_size, "num_hidden_layers": w.num_layers,
              "num_attention_heads": w.num_heads, "num_key_value_heads": w.num_kv_heads,
              "tie_word_embeddings": w.tie_embeddings, "rms_norm_eps": w.rms_norm_eps,
              "rope_parameters": {"rope_theta": w.rope_theta, "rope_type": "default"}}
    config.update(config_changes)
    write_weights(path / "model.safetensors", llama_param_shapes(w))
    (path / "config.json").write_text(json.dumps(config))
    return path


def refused(overrides, *fragments):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    return str(err.value)


def with_checkpoint(path):
    return [*SMALL_TEACHER, f"workload.distill.teacher.checkpoint={path}"]


# --- checkpoints that are accepted ----------------------------------------------------------------

def test_a_folder_written_by_transformers_is_accepted(tmp_path):
    from benchmarks.training.model import build_model
    from harness.plan import model_spec

    w = teacher_workload(compose(["workload=llama-tiny-kd"]).workload)
    build_model(model_spec(w)).save_pretrained(tmp_path / "teacher")
    cfg = compose(["workload=llama-tiny-kd", f"workload.distill.teacher.checkpoint={tmp_path / 'teacher'}"])
    info = validate_checkpoint(str(tmp_path / "teacher"), teacher_workload(cfg.workload))
    assert info.num_params == 4_999_424 and info.dtypes == ("F32",)


def test_a_single_safetensors_file_and_the_plan_gets_its_absolute_path(tmp_path, small_teacher, monkeypatch):
    from harness.bench import plan_suite

    write_weights(tmp_path / "t.safetensors", llama_param_shapes(small_teacher))
    monkeypatch.chdir(tmp_path)
    _, planned = plan_suite(["suite=single", *with_checkpoint("t.safetensors")])
    assert planned[0].run.spec.distill.teacher_checkpoint == str(tmp_path / "t.safetensors")
    assert planned[0].run.spec.distill.teacher_files == [str(tmp_path / "t.safetensors")]


def test_a_sharded_folder_with_its_index_is_accepted(tmp_path, small_teacher):
    shapes = llama_param_shapes(small_teacher)
    names = sorted(shapes)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, members in parts.items():
        write_weights(tmp_path / "t" / shard, {n: shapes[n] for n in members})
    index = {"metadata": {}, "weight_map": {n: shard for shard, members in parts.items() for n in members}}
    (tmp_path / "t" / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "t" / "stale.safetensors").write_bytes(b"")  # not in the index: never opened
    compose(with_checkpoint(tmp_path / "t"))
    files = distill_spec(compose(with_checkpoint(tmp_path / "t")).workload).teacher_files
    assert files == [str(tmp_path / "t" / shard) for shard in sorted(parts)]
    (tmp_path / "t" / "model-00002-of-00002.safetensors").unlink()
    refused(with_checkpoint(tmp_path / "t"), "shards named in model.safetensors.index.json are missing",
            "model-00002-of-00002.safetensors")


def test_a_tied_teacher_accepts_a_checkpoint_that_also_saved_the_head(tmp_path):
    overrides = [*SMALL_TEACHER, "workload.distill.teacher.tie_embeddings=true"]
    w = teacher_workload(compose(overrides).workload)
    assert "lm_head.weight" not in llama_param_shapes(w)
    write_weights(tmp_path / "t.safetensors", llama_param_shapes(w), extra={"lm_head.weight": (4096, 64)})
    compose([*overrides, f"workload.distill.teacher.checkpoint={tmp_path / 't.safetensors'}"])


# --- checkpoints that are refused, each with what is wrong ---------------------------------------

def test_a_missing_checkpoint_is_refused_and_never_downloaded():
    refused(["workload=llama-tiny-kd", "workload.distill.teacher.checkpoint=meta-llama/Meta-Llama-3-8B"],
            "workload.distill.teacher.checkpoint='meta-llama/Meta-Llama-3-8B' does not exist",
            "never downloaded")


def test_a_config_json_of_another_shape_names_each_field_and_what_to_set(tmp_path, small_teacher):
    folder = hf_folder(tmp_path / "t", small_teacher, hidden_size=128, num_hidden_layers=3)
    msg = refused(with_checkpoint(folder), "does not match the teacher's shape",
                  "hidden_size=128 in config.json, 64 in the config (set workload.distill.teacher.hidden_size)",
                  "num_layers=3 in config.json, 1 in the config (set workload.distill.teacher.num_layers)")
    assert "intermediate_size" not in msg


def test_a_vocabulary_mismatch_points_at_the_workload(tmp_path, small_teacher):
    folder = hf_folder(tmp_path / "t", small_teacher, vocab_size=32000)
    refused(with_checkpoint(folder), "vocab_size=32000 in config.json, 4096 in the config (set workload.vocab_size)")


def test_old_style_rope_theta_is_read_and_compared(tmp_path, small_teacher):
    folder = hf_folder(tmp_path / "t", small_teacher, rope_parameters=None, rope_theta=500000.0)
    refused(with_checkpoint(folder), "rope_theta=500000.0 in config.json, 10000.0 in the config")


@pytest.mark.parametrize("changes,fragment", [
    ({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0}}, "rope scaling"),
    ({"model_type": "mistral"}, "is a 'mistral' model"),
    ({"head_dim": 32}, "head_dim=32"),
])
def test_what_the_suites_llama_cannot_be_is_refused(tmp_path, small_teacher, changes, fragment):
    refused(with_checkpoint(hf_folder(tmp_path / "t", small_teacher, **changes)), fragment)


def test_tensor_shapes_are_checked_without_a_config_json(tmp_path, small_teacher):
    shapes = llama_param_shapes(small_teacher)
    path = write_weights(tmp_path / "t.safetensors", shapes, change={"model.layers.0.mlp.up_proj.weight": (256, 64)})
    refused(with_checkpoint(path), "wrong shapes: model.layers.0.mlp.up_proj.weight [256, 64] (expected [128, 64])")


def test_missing_and_unexpected_tensors_are_listed(tmp_path, small_teacher):
    shapes = llama_param_shapes(small_teacher)
    path = write_weights(tmp_path / "t.safetensors", shapes, drop=("model.norm.weight",),
                         extra={"model.layers.1.mlp.up_proj.weight": (128, 64)})
    refused(with_checkpoint(path), "missing tensors: model.norm.weight",
            "unexpected tensors: model.layers.1.mlp.up_proj.weight", "1 layers, hidden 64")


def test_a_checkpoint_of_the_default_teacher_does_not_fit_a_smaller_one(tmp_path):
    w = teacher_workload(compose(["workload=llama-tiny-kd"]).workload)
    path = write_weights(tmp_path / "t.safetensors", llama_param_shapes(w))
    refused(with_checkpoint(path), "wrong shapes", "unexpected tensors", "and ")


def test_pickled_weights_are_not_loaded(tmp_path):
    (tmp_path / "t").mkdir()
    torch.save({"x": torch.zeros(1)}, tmp_path / "t" / "pytorch_model.bin")
    refused(with_checkpoint(tmp_path / "t"), "holds no .safetensors weights", "pytorch_model.bin",
            "pickled weights are not loaded")
    refused(with_checkpoint(tmp_path / "t" / "pytorch_model.bin"), "is not a .safetensors file")


@pytest.mark.parametrize("content", [b"", b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}", b"\xff" * 8 + b"{}"],
                         ids=["empty", "bad-json", "huge-length"])
def test_a_corrupt_safetensors_file_is_refused(tmp_path, content):
    (tmp_path / "t.safetensors").write_bytes(content)
    refused(with_checkpoint(tmp_path / "t.safetensors"), "is not a readable .safetensors file")


# --- the distillation settings ----------------------------------------------------------------------

@pytest.mark.parametrize("overrides,fragments", [
    (["workload.distill.alpha=1.5"], ["workload.distill.alpha=1.5", "[0, 1]"]),
    (["workload.distill.temperature=0"], ["workload.distill.temperature=0.0", "positive"]),
    (["workload.distill.teacher.num_kv_heads=3"], ["workload.distill.teacher.num_kv_heads=3", "num_heads=4"]),
    (["workload.distill.teacher.num_heads=3"], ["workload.distill.teacher.num_heads=3", "hidden_size=256"]),
    (["workload.distill.teacher.precision=fp16"], ["workload.distill.teacher.precision='fp16'", "needs a GPU"]),
    (["workload.name=llama-tiny"], ["workload.name='llama-tiny'", "<model>-<size>-kd"]),
])
def test_bad_distillation_settings_are_refused(overrides, fragments):
    refused(["workload=llama-tiny-kd", *overrides], *fragments)


def test_a_kd_name_without_a_teacher_is_refused():
    refused(["workload=llama-tiny", "workload.name=llama-tiny-kd"], "workload.name='llama-tiny-kd'")


def test_bench_with_a_bad_checkpoint_stops_before_launch_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([VENV_PYTHON, "-m", "harness", "bench", f"out={out}", "suite=single",
                           "workload=llama-tiny-kd", f"workload.distill.teacher.checkpoint={tmp_path / 'none'}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "workload.distill.teacher.checkpoint=" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
