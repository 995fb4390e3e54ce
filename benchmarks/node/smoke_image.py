"""Smoke test of an installed stack (a container image at build time, or the venv): torch,
deepspeed and transformers import, transformers accepts this torch, and the llama-440m model of
conf/workload/llama-440m.yaml builds on the meta device (no memory, no GPU) with the suite's own
builder (benchmarks/training/model.py), with the expected parameter count.

Run from the suite's root (containers/Dockerfile.gpu RUNs it after copying the suite):
  python -m benchmarks.node.smoke_image
Exit 0 with one line naming the versions; exit 1 with a message naming them otherwise.

Why a build, not an import: transformers treats a torch older than its minimum (2.6.0 for
transformers 5.x; `packaging` orders 2.6.0a0 below 2.6.0) as absent, yet `import transformers`
succeeds; only building a model fails, and it did on every GPU rank of an image whose imports
all passed.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional, Sequence

import yaml

from contract.spec import ModelSpec

SUITE_ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = "llama-440m"
EXPECTED_PARAMS = {"llama-440m": 439_927_808}
"""Parameters of the workload's model (conf/workload/llama-440m.yaml, README, test_flops)."""


class SmokeError(Exception):
    """The stack cannot build the suite's model."""


def versions() -> str:
    """`python X, torch Y (cuda Z), deepspeed ..., transformers ...` from the installed
    distributions (works when an import fails)."""
    parts = [f"python {sys.version.split()[0]}"]
    for name in ("torch", "deepspeed", "transformers"):
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} not installed")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        parts[1] += f" (cuda {torch.version.cuda})"
    return ", ".join(parts)


def workload_spec(name: str = WORKLOAD):
    """The ModelSpec the harness gives the ranks for conf/workload/<name>.yaml, read here without
    the harness (benchmarks/ never imports harness/): the file's shape fields, ModelSpec's own
    defaults for those it leaves out, seq_len as max_position_embeddings (harness.plan.model_spec;
    tests/unit/test_image_check.py checks the two agree)."""
    path = SUITE_ROOT / "conf" / "workload" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    fields = {f.name for f in dataclasses.fields(ModelSpec)} - {"max_position_embeddings"}
    return ModelSpec(max_position_embeddings=data["seq_len"], **{k: v for k, v in data.items() if k in fields})


def check(name: str = WORKLOAD) -> str:
    """Build `name` on the meta device; the summary line, or SmokeError."""
    try:  # deepspeed's import picks its accelerator: a broken install fails here
        torch = [importlib.import_module(m) for m in ("torch", "deepspeed", "transformers")][0]
    except Exception as e:  # an ImportError, or what a broken extension raises on import
        raise SmokeError(f"import failed: {type(e).__name__}: {e}") from None
    from transformers.utils import is_torch_available

    if not is_torch_available():
        raise SmokeError("transformers does not accept this torch (it treats a torch older than its "
                         "minimum as absent; see transformers/utils/import_utils.py), so no model can be built")
    try:
        spec = workload_spec(name)
    except Exception as e:
        raise SmokeError(f"reading conf/workload/{name}.yaml failed: {type(e).__name__}: {e}") from None
    try:
        from benchmarks.training.model import build_model

        model = build_model(spec, device="meta")
    except Exception as e:
        raise SmokeError(f"building {name} (LlamaForCausalLM) on the meta device failed: "
                         f"{type(e).__name__}: {e}") from None
    params = list(model.parameters())
    if not all(p.device == torch.device("meta") for p in params):
        raise SmokeError(f"{name}: some parameters are not on the meta device")
    count = sum(p.numel() for p in params)
    expected = EXPECTED_PARAMS[name]
    if count != expected:
        raise SmokeError(f"{name} built with {count:,} parameters, expected {expected:,} "
                         f"(conf/workload/{name}.yaml or this transformers changed the model)")
    return f"{name} on the meta device: {count:,} parameters"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.node.smoke_image", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default=WORKLOAD, choices=sorted(EXPECTED_PARAMS))
    ns = ap.parse_args(argv)
    try:
        summary = check(ns.workload)
    except SmokeError as e:
        print(f"error: image smoke test FAILED: {e}\n  stack: {versions()}", file=sys.stderr)
        return 1
    print(f"image smoke test passed: {summary}; {versions()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
