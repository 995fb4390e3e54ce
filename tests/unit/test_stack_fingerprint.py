"""The fingerprint knows the training stack (issue 38 item 5): the versions of Triton, Liger Kernel and
torchao (a rank and the controller, from the packages' metadata, None when absent), the compilers'
variables (Inductor, Dynamo, Triton; not the cache directories), what ran of the stack
(environment.stack: compile mode, backend, path, the SDPA backend used); a comparison names each when
it differs, as it names any library; the record schema describes them and older records stay valid."""
from __future__ import annotations

import copy
import json
import subprocess
from importlib import metadata

import pytest
from unit_helpers import REPO_ROOT, VENV_PYTHON

from contract import fingerprint as fp
from harness.plan import rank_env
from harness.record import controller_environment, validate_record
from harness.verdict.ab import against
from harness.verdict.changes import environment_diff, package_diff, stack_diff

EAGER = {"kernels": "eager", "compile": "none", "attention": "auto", "attention_used": ["flash"], "compile_watch": {}}
COMPILED = {"kernels": "eager", "compile": "torch", "mode": "default", "backend": "inductor",
            "path": "deepspeed engine.compile (torch.compile)", "attention": "auto", "attention_used": ["flash"],
            "compile_watch": {"frames_compiled": 18, "recompiles": 0, "recompile_reasons": [], "graph_breaks": 0,
                              "graph_break_reasons": [], "failures": [],
                              "dynamo_seconds": {"entire_frame_compile_time_s": 9.8, "backend_compile_time_s": 2.4}}}
ENV = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.23.0", "triton": None,
       "liger_kernel": None, "torchao": "0.18.0", "nccl": None, "driver": None, "cuda": None, "gpu_model": None,
       "gpu_count": 0, "container_image": None, "hosts": ["box"], "num_nodes": 1, "num_ranks": 2,
       "env": {"OMP_NUM_THREADS": "1"}, "suite_commit": "abc", "lock_mismatches": {}, "stack": COMPILED}


def test_the_stack_packages_are_read_from_their_metadata_none_when_absent(monkeypatch):
    installed = {"pytorch-triton": "3.6.0+git1", "torchao": "0.18.0"}

    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]
    monkeypatch.setattr(fp.metadata, "version", version)
    # PyTorch's own Triton build counts as Triton; Liger Kernel absent is None, not an error
    assert fp.stack_versions() == {"triton": "3.6.0+git1", "liger_kernel": None, "torchao": "0.18.0"}
    assert {k: controller_environment()[k] for k in fp.STACK_PACKAGES} == fp.stack_versions()


def test_the_controller_fills_them_without_importing_torch():
    code = ("import sys, json; from harness.record import controller_environment; e = controller_environment(); "
            "print(json.dumps([{k: e[k] for k in ('triton', 'liger_kernel', 'torchao')}, 'torch' in sys.modules]))")
    out = subprocess.run([VENV_PYTHON, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    versions, torch_imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert versions == fp.stack_versions() and torch_imported is False


def test_a_rank_fills_them_too():
    pytest.importorskip("torch")
    from benchmarks.node.environment import fingerprint

    env = fingerprint(2)
    assert {k: env[k] for k in fp.STACK_PACKAGES} == fp.stack_versions()
    assert list(env).index("torchao") < list(env).index("cuda")   # beside the other packages, FIELDS' order


def test_the_compilers_variables_are_recorded_and_their_cache_directories_are_not():
    environ = {"TORCHINDUCTOR_DEBUG_COMPILE": "1", "TORCH_COMPILE_DISABLE": "1", "TORCHDYNAMO_VERBOSE": "1",
               "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_SHAPES": "0", "TRITON_DEFAULT_FP_FUSION": "0",
               "TRITON_CACHE_DIR": "/repo/.cache/triton", "TRITON_HOME": "/home/me", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
               "TORCH_EXTENSIONS_DIR": "/repo/.cache/torch_extensions", "TORCH_LOGS": "+dynamo", "HOME": "/root",
               "OMP_NUM_THREADS": "1"}
    kept = fp.recorded_env(environ)
    assert list(kept) == ["OMP_NUM_THREADS", "TORCHDYNAMO_VERBOSE", "TORCHINDUCTOR_DEBUG_COMPILE", "TORCH_COMPILE_DISABLE",
                          "TORCH_DYNAMO_AUTOMATIC_DYNAMIC_SHAPES", "TRITON_DEFAULT_FP_FUSION"]


def test_what_the_harness_gives_every_rank_per_checkout_is_never_recorded(composed, tmp_path):
    """harness/plan.py gives each rank TRITON_CACHE_DIR and TORCH_EXTENSIONS_DIR under this checkout:
    two checkouts would otherwise differ in every record (the controller's fallback reads them)."""
    given = rank_env(composed(["platform=cpu", "workload.compile=torch"]), REPO_ROOT, tmp_path)
    assert {"TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR"} <= set(given)
    assert fp.recorded_env(given) == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def test_a_comparison_names_the_stack_packages_as_any_library_once():
    now = {**ENV, "triton": "3.6.0", "torchao": "0.17.0",
           "lock_mismatches": {"torchao": {"lock": "0.18.0", "seen": "0.17.0"}, "liger-kernel": {"lock": "0.8.5", "seen": None},
                               "sympy": {"lock": "1.14.0", "seen": "1.13.3"}}}
    assert environment_diff(ENV, now) == {"triton": [None, "3.6.0"], "torchao": ["0.18.0", "0.17.0"],
                                          "package.sympy": ["1.14.0", "1.13.3"]}
    # a lock's liger-kernel is the field liger_kernel: named by it, not again as a package
    assert package_diff({}, {"liger-kernel": {"lock": "0.8.5", "seen": "0.8.4"}}) == {}
    assert {"triton", "liger_kernel", "torchao"} <= set(fp.COMPARED)
    # a reference written before the fields existed (every shipped cpu reference) says nothing of them:
    # a box with torchao installed is not "None -> 0.18.0" against it
    older = {k: v for k, v in ENV.items() if k not in fp.STACK_PACKAGES}
    assert environment_diff(older, ENV) == {} and environment_diff(older, {**ENV, "torch": "2.14.0"}) == {
        "torch": ["2.13.0", "2.14.0"]}


def test_a_comparison_names_what_ran_of_the_stack():
    cudnn = {**COMPILED, "attention_used": ["cudnn"]}
    assert stack_diff(COMPILED, cudnn) == {"stack.attention_used": ["flash", "cudnn"]}
    other = {**COMPILED, "mode": "max-autotune", "backend": "aot_eager", "path": "deepspeed engine.compile (DeepCompile)",
             "attention_used": ["flash", "math"]}
    assert stack_diff(COMPILED, other) == {"stack.mode": ["default", "max-autotune"], "stack.backend": ["inductor", "aot_eager"],
                                           "stack.path": ["deepspeed engine.compile (torch.compile)",
                                                          "deepspeed engine.compile (DeepCompile)"],
                                           "stack.attention_used": ["flash", "flash, math"]}
    # the compile watch's counts are metrics (compile_s, graph_breaks, recompiles), not what changed
    watched = copy.deepcopy(COMPILED)
    watched["compile_watch"].update(graph_breaks=3, frames_compiled=40)
    assert stack_diff(COMPILED, watched) == {}
    # the rank's host threads: named where both records hold them (a GPU rank ran one thread before they were kept)
    assert stack_diff({**COMPILED, "host_threads": 1}, {**COMPILED, "host_threads": 16}) == {"stack.host_threads": [1, 16]}
    assert stack_diff(COMPILED, {**COMPILED, "host_threads": 16}) == {}
    # a record from before the stack was kept names nothing of it (every older reference)
    assert stack_diff(None, COMPILED) == {} and stack_diff(EAGER, None) == {}
    assert environment_diff({**ENV, "stack": None}, ENV) == {}
    assert environment_diff(ENV, {**ENV, "stack": cudnn}) == {"stack.attention_used": ["flash", "cudnn"]}


def _record(run_id: str, samples_per_s: float, env: dict) -> dict:
    return {"schema_version": "1.2", "run_id": run_id, "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
            "status": "ok", "reason": None,
            "config": {"platform": {"nodes": 1}, "zero": {"stage": 1},
                       "workload": {"micro_batch_size": 2, "grad_acc_steps": 4, "seq_len": 128, "precision": "fp32",
                                    "compile": "torch", "compile_mode": "default", "kernels": "eager", "attention": "auto"}},
            "overrides": ["workload.compile=torch"], "environment": env, "microsteps": [],
            "metrics": {k: {"value": v, "unit": u, "mode": "throughput"} for k, v, u in (
                ("samples_per_s", samples_per_s, "samples/s"), ("tokens_per_s", samples_per_s * 128, "tokens/s"),
                ("step_time_s", 8 / samples_per_s, "s"), ("peak_mem_gib", 0.7, "GiB"), ("mfu_pct", 15.0, "%"),
                ("compile_s", 9.0, "s"))}}


def _write(folder, records):
    folder.mkdir(parents=True)
    for r in records:
        assert validate_record(r) == [], validate_record(r)
        (folder / f"{r['run_id']}.json").write_text(json.dumps(r), encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize("change, named", [
    ({"env": {**ENV["env"], "TORCHINDUCTOR_DEBUG_COMPILE": "1"}}, {"env.TORCHINDUCTOR_DEBUG_COMPILE": [None, "1"]}),
    ({"triton": "3.5.1"}, {"triton": [None, "3.5.1"]}),
    ({"stack": {**COMPILED, "attention_used": ["math"]}}, {"stack.attention_used": ["flash", "math"]}),
])
def test_compare_against_calls_a_slowdown_in_the_stack_a_regression_naming_it(tmp_path, change, named):
    old = _write(tmp_path / "old", [_record(f"old{i}", v, ENV) for i, v in enumerate([13.1, 13.6, 12.9])])
    new = _write(tmp_path / "new", [_record(f"new{i}", v, {**ENV, **change}) for i, v in enumerate([3.7, 3.4])])
    verdicts, _ = against([new], [old])
    (v,) = [v for v in verdicts if v.metric == "samples_per_s"]
    assert v.verdict == "regression" and v.environment_diff == named
    (m,) = [v for v in verdicts if v.metric == "peak_mem_gib"]
    assert m.verdict == "pass" and m.environment_diff == named   # named whatever the verdict


def test_the_schema_describes_the_stack_and_keeps_older_records_valid():
    rec = _record("r", 13.0, ENV)
    assert validate_record(rec) == []
    older = copy.deepcopy(rec)
    older["schema_version"] = "1.1"
    for k in ("triton", "liger_kernel", "torchao", "stack"):
        del older["environment"][k]
    assert validate_record(older) == []
    bad = copy.deepcopy(rec)
    bad["environment"].update(torchao=18, stack={**COMPILED, "attention_used": "flash"})
    problems = validate_record(bad)
    assert any(p.startswith("environment/torchao") for p in problems)
    assert any(p.startswith("environment/stack/attention_used") for p in problems)
    schema = json.loads((REPO_ROOT / "schemas" / "record.schema.json").read_text(encoding="utf-8"))
    described = schema["properties"]["environment"]["properties"]
    assert {"triton", "liger_kernel", "torchao", "stack"} <= set(described)
    assert set(fp.STACK_COMPARED) <= set(described["stack"]["properties"])
