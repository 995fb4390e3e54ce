"""The distillation teacher seen from the controller: its shape, its parameter names and shapes,
and the check of a local checkpoint before anything launches. No torch: a .safetensors header is
8 bytes of little-endian length and a JSON table (safetensors format), read here directly.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError
from .schema import TEACHER_SHAPE_FIELDS, WorkloadConfig

SAFETENSORS_INDEX = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 2**20  # the safetensors reference implementation's limit
MAX_LISTED = 5


def teacher_workload(w: WorkloadConfig) -> WorkloadConfig:
    """The teacher as a workload: the student's shape with the teacher's set fields over it
    (same vocabulary, same sequence length), and the teacher's precision."""
    assert w.distill is not None, f"workload {w.name} has no teacher"
    t = w.distill.teacher
    changes: dict[str, Any] = {k: getattr(t, k) for k in TEACHER_SHAPE_FIELDS if getattr(t, k) is not None}
    return dataclasses.replace(w, name=f"{w.name}/teacher", precision=t.precision, distill=None, **changes)


def llama_param_shapes(w: WorkloadConfig) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of transformers' LlamaForCausalLM of this shape (its state dict
    names, as in a Hugging Face checkpoint). A tied output head has no tensor of its own."""
    h, f, head_dim = w.hidden_size, w.intermediate_size, w.hidden_size // w.num_heads
    q, kv = w.num_heads * head_dim, w.num_kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (w.vocab_size, h)}
    for i in range(w.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
            p + "mlp.down_proj.weight": (h, f),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    shapes["model.norm.weight"] = (h,)
    if not w.tie_embeddings:
        shapes["lm_head.weight"] = (w.vocab_size, h)
    return shapes


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    files: tuple[str, ...]
    """The .safetensors files holding the weights (the ranks map names to files from their headers)."""
    num_params: int
    dtypes: tuple[str, ...]


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} from a .safetensors file's header."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", raw)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise ValueError(f"header length {length} is not plausible")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"teacher checkpoint {path} is not a readable .safetensors file: {exc}") from None
    if not isinstance(header, dict):
        raise ConfigError(f"teacher checkpoint {path} has a malformed safetensors header")
    header.pop("__metadata__", None)
    return header


def checkpoint_files(path: Path) -> list[Path]:
    """The .safetensors files of a checkpoint: the file itself, a folder's index's shards, or a
    folder's model*.safetensors. Pickled weights (.bin, .pt) are never loaded."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ConfigError(f"workload.distill.teacher.checkpoint={str(path)!r} is not a .safetensors file; "
                              "valid: a .safetensors file or a Hugging Face folder with safetensors weights")
        return [path]
    index = path / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"teacher checkpoint index {index} is unreadable: {exc!r}") from None
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ConfigError(f"teacher checkpoint {path}: shards named in {SAFETENSORS_INDEX} are missing: "
                              + ", ".join(missing[:MAX_LISTED]))
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt"))
        hint = (f" (found {', '.join(pickled[:MAX_LISTED])}: pickled weights are not loaded; convert "
                "them to safetensors)") if pickled else ""
        raise ConfigError(f"teacher checkpoint folder {path} holds no .safetensors weights{hint}")
    return files


# config.json key of a Hugging Face LlamaConfig -> the workload field it must equal.
HF_CONFIG_FIELDS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
                    "intermediate_size": "intermediate_size", "num_hidden_layers": "num_layers",
                    "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
                    "tie_word_embeddings": "tie_embeddings", "rope_theta": "rope_theta",
                    "rms_norm_eps": "rms_norm_eps"}


def hf_config_values(config: dict[str, Any]) -> dict[str, Any]:
    """The shape of a Hugging Face config.json in workload field names (old and new layouts:
    transformers 5 keeps rope_theta under rope_parameters)."""
    values = {field: config[key] for key, field in HF_CONFIG_FIELDS.items() if key in config}
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in values and "rope_theta" in rope:
        values["rope_theta"] = rope["rope_theta"]
    if "num_kv_heads" not in values and "num_heads" in values:
        values["num_kv_heads"] = values["num_heads"]  # LlamaConfig's default
    return values


def check_hf_config(folder: Path, w: WorkloadConfig) -> None:
    path = folder / "config.json"
    if not path.is_file():
        return  # weights alone: the tensor shapes are the check
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"teacher checkpoint {path} is not readable JSON: {exc}") from None
    if config.get("model_type", "llama") != "llama":
        raise ConfigError(f"teacher checkpoint {folder} is a {config.get('model_type')!r} model; "
                          "the teacher is a LLaMA (model_type 'llama')")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ConfigError(f"teacher checkpoint {folder} uses rope scaling {rope!r}, which the suite's "
                          "LLaMA does not apply; valid: default rotary embeddings")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != w.hidden_size // w.num_heads:
        raise ConfigError(f"teacher checkpoint {folder}: head_dim={head_dim} but the teacher's "
                          f"hidden_size / num_heads = {w.hidden_size // w.num_heads}")
    wrong = []
    for field, value in hf_config_values(config).items():
        mine = getattr(w, field)
        same = math.isclose(value, mine, rel_tol=1e-9) if isinstance(mine, float) else value == mine
        if not same:
            where = "workload.vocab_size" if field == "vocab_size" else f"workload.distill.teacher.{field}"
            wrong.append(f"{field}={value!r} in config.json, {mine!r} in the config (set {where})")
    if wrong:
        raise ConfigError(f"teacher checkpoint {folder} does not match the teacher's shape: " + "; ".join(wrong))


def validate_checkpoint(checkpoint: Optional[str], w: WorkloadConfig) -> Optional[CheckpointInfo]:
    """Check a teacher checkpoint against the teacher's shape without loading a tensor: config.json
    (when there is one), then every tensor's name and shape. Raises ConfigError naming what is wrong."""
    if checkpoint is None:
        return None
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise ConfigError(f"workload.distill.teacher.checkpoint={checkpoint!r} does not exist; valid: a local "
                          "Hugging Face folder or .safetensors file (weights are never downloaded)")
    files = checkpoint_files(path)
    if path.is_dir():
        check_hf_config(path, w)
    found: dict[str, tuple[int, ...]] = {}
    dtypes: set[str] = set()
    for f in files:
        for name, entry in read_safetensors_header(f).items():
            found[name] = tuple(entry.get("shape", ()))
            dtypes.add(str(entry.get("dtype")))
    expected = llama_param_shapes(w)
    if w.tie_embeddings:
        found.pop("lm_head.weight", None)  # a tied head may be saved; it is the embedding
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    shapes = sorted(f"{n} {list(found[n])} (expected {list(s)})" for n, s in expected.items()
                    if n in found and found[n] != s)
    problems = []
    for label, items in (("wrong shapes", shapes), ("missing tensors", missing), ("unexpected tensors", extra)):
        if items:
            more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
            problems.append(f"{label}: {', '.join(items[:MAX_LISTED])}{more}")
    if problems:
        raise ConfigError(f"teacher checkpoint {checkpoint} does not match the teacher "
                          f"({w.num_layers} layers, hidden {w.hidden_size}, vocab {w.vocab_size}): "
                          + "; ".join(problems))
    num_params = sum(math.prod(s) for s in expected.values())
    return CheckpointInfo(str(path), tuple(str(f) for f in files), num_params, tuple(sorted(dtypes)))
