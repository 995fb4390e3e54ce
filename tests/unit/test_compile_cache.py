"""measure.compile_cache: the compilers' on-disk caches a compiled run starts from (issue 38 item 1, compile
time measured apart). Inductor keeps every compiled graph under TORCHINDUCTOR_CACHE_DIR, so a second run of a
configuration loaded what the first compiled (llama-tiny ZeRO-1 on 2 cores: 23.6-25.1 s cold, 3.4-3.7 s warm)
and compile_s said nothing of which it was. cold (the default): the run's ranks share an empty cache in the run
folder, removed after the launch; warm: the environment's caches; the record counts what the caches gave."""
from __future__ import annotations

import pytest

from benchmarks.training.stack import CompileWatch
from harness.bench import drop_compile_cache, plan_suite, prepare_run_dir
from harness.config.compose import compose
from harness.errors import ConfigError
from harness.plan import COLD_CACHE, compile_cache_env, train_spec
from harness.stack_view import cache_label, stack_metrics


def _planned(tmp_path, *overrides):
    _, planned = plan_suite(["suite=single", f"out={tmp_path / 'out'}", *overrides])
    return planned[0].run


def test_a_cold_run_compiles_into_its_own_folder_which_all_its_ranks_share(tmp_path):
    run = _planned(tmp_path, "workload.compile=torch")
    folder = run.run_dir.resolve() / COLD_CACHE
    assert run.env["TORCHINDUCTOR_CACHE_DIR"] == str(folder) and run.env["TRITON_CACHE_DIR"] == str(folder / "triton")


def test_warm_eager_and_collective_runs_keep_the_environments_caches(tmp_path):
    for overrides in (["workload.compile=torch", "measure.compile_cache=warm"], [], ["kind=collective"]):
        run = _planned(tmp_path, *overrides)
        assert "TORCHINDUCTOR_CACHE_DIR" not in run.env and not str(run.env["TRITON_CACHE_DIR"]).startswith(str(run.run_dir))
        assert compile_cache_env(compose(overrides), run.run_dir) == {}


def test_the_folder_is_emptied_before_a_launch_and_gone_after_it(tmp_path):
    """A relaunch into a run folder (a resumed tune) finds no kernels of the launch before; what the ranks
    compiled is no part of the results."""
    run = _planned(tmp_path, "workload.compile=torch")
    (run.run_dir / COLD_CACHE / "fxgraph").mkdir(parents=True)
    prepare_run_dir(run)
    assert (run.run_dir / "config.yaml").exists() and not (run.run_dir / COLD_CACHE).exists()
    (run.run_dir / COLD_CACHE / "triton").mkdir(parents=True)
    drop_compile_cache(run)
    assert not (run.run_dir / COLD_CACHE).exists()


def test_a_real_inductor_compile_misses_cold_then_hits_the_cache_it_filled(monkeypatch, tmp_path):
    """Inductor for real: an empty folder, so the graph is compiled (a miss); the same function compiled again
    after Dynamo forgets it is loaded from that folder (a hit). A matmul alone: Inductor calls ATen's mm and
    builds no C++ kernel (2 s, not 12 s with one elementwise kernel's g++ build)."""
    import torch

    def f(x):
        return x @ x.t()

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / COLD_CACHE))
    cold = CompileWatch(True, "cold")
    torch.compile(f, backend="inductor")(torch.randn(4, 4))
    first = cold.summary()["cache"]
    torch._dynamo.reset()
    warm = CompileWatch(True, "warm")        # counters start again
    torch.compile(f, backend="inductor")(torch.randn(4, 4))
    second = warm.summary()["cache"]
    torch._dynamo.reset()
    assert first["setting"] == "cold" and first["fx_graph"]["miss"] >= 1 and first["fx_graph"]["hit"] == 0
    assert second["fx_graph"]["hit"] >= 1 and second["fx_graph"]["miss"] == 0
    assert cache_label(first).startswith("cold: ") and cache_label(second).startswith("warm: ")


def test_the_caches_in_words_beside_compile_s():
    cold = {"setting": "cold", "fx_graph": {"hit": 0, "miss": 2, "bypass": 0}, "aot_autograd": {"hit": 0, "miss": 1}}
    warm = {"setting": "warm", "fx_graph": {"hit": 2, "miss": 0, "bypass": 0}, "aot_autograd": {"hit": 1, "miss": 0}}
    partly = {"setting": "warm", "fx_graph": {"hit": 1, "miss": 3, "bypass": 1}, "aot_autograd": {}}
    assert cache_label(cold) == "cold: 2 graphs compiled"
    assert cache_label(warm) == "warm: 2 of 2 graphs from the cache"
    assert cache_label(partly) == "warm: 1 of 5 graphs from the cache"
    assert cache_label(None) is None            # a record from before the caches were counted
    steps = [{"warmup": True, "mode": "throughput", "step_time_s": 30.0},
             {"warmup": False, "mode": "throughput", "step_time_s": 1.0}]
    m = stack_metrics({"compile": "torch", "compile_watch": {"cache": warm}}, steps)
    assert m["compile_s"]["cache"] == "warm: 2 of 2 graphs from the cache"


def test_the_setting_reaches_the_ranks_and_a_wrong_one_names_the_valid_ones():
    assert train_spec(compose(["workload.compile=torch"]), "r", {}).stack.compile_cache == "cold"
    assert train_spec(compose(["workload.compile=torch", "measure.compile_cache=warm"]), "r", {}).stack.compile_cache == "warm"
    with pytest.raises(ConfigError) as e:
        compose(["measure.compile_cache=hot"])
    assert "measure.compile_cache" in str(e.value) and "cold" in str(e.value) and "warm" in str(e.value)
