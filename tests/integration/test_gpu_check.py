"""`make gpu-check`'s whole flow, on the cpu platform (CI has no GPU): detection replaced by a
stand-in, the gpu-check-cpu suite (gpu-check's runs with llama-tiny in place of llama-440m) on two gloo ranks, the plain
DeepSpeed loop for the instrument's cost, gpu-check.md and gpu-check.json."""
from __future__ import annotations

import json

from harness.gpu_check import Detected, gpu_check

TINY = ["platform=cpu", "suite=gpu-check-cpu", "confirm_regressions=0"]   # its record counts: no rerun of a regression


def test_the_whole_gpu_check_flow_runs_on_the_cpu_platform(tmp_path, capsys):
    out = tmp_path / "out"
    rc = gpu_check([*TINY, f"out={out}"], Detected(True, 2, "cpu stand-in"))
    printed = capsys.readouterr().out
    assert rc == 0, printed[-3000:]
    s = json.loads((out / "gpu-check.json").read_text())
    assert [(t["zero"], t["stack"]) for t in s["training"]] == [(0, "eager"), (1, "eager"), (2, "eager"), (3, "eager"),
                                                                (1, "torch")]
    for t in s["training"]:
        assert t["status"] == "ok" and t["mfu_pct"] > 0 and t["peak_mem_gib"] > 0 and t["predicted_peak_gib"] > 0
        assert t["peak_error_pct"] is not None and t["profile_overhead_pct"] is not None
    assert {c["op"] for c in s["collectives"]} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                   "broadcast", "reduce", "sendrecv"}
    assert all(c["status"] == "ok" and c["num_wrong"] == 0 and not c["smoke"] for c in s["collectives"])  # 2 ranks
    assert [p["run"] for p in s["plain"]] == ["z2", "z1-compile"]   # eager and compiled: the instrument's cost on each
    assert all(p["ok"] and p["harness_over_plain"] > 0 for p in s["plain"])
    # the compiled bare loop loads the graphs its harness run compiled cold, instead of compiling them again
    assert s["plain"][0]["compile_cache"] is None and "from the cache" in s["plain"][1]["compile_cache"]
    compiled = s["training"][-1]   # Inductor's C++ backend, for real: compile seconds apart from the measured steps
    assert compiled["compile_s"] > 1 and compiled["graph_breaks"] == 0 and compiled["attention_used"] == ["flash"]
    # gpu-check compiles cold (measure.compile_cache's default): whatever this box compiled before, nothing is loaded
    assert compiled["compile_cache"].startswith("cold: ") and "graphs compiled" in compiled["compile_cache"]
    # the cold caches: the compiled run's, kept for its bare loop (which loads what it compiled), removed after it
    assert not list(out.rglob("compile-cache"))
    md = (out / "gpu-check.md").read_text()
    assert "| z2 | 2 |" in md and "a bare DeepSpeed loop" in md and "| z1-compile | torch |" in md
    assert (out / "summary.md").exists() and len(list(out.glob("0*-z*.json"))) == 5
    # its summary JSON sits beside the records: the readers of a results folder skip it
    from harness.verdict.compare import load_records
    from harness.verdict.submit import read_records
    assert len(load_records([str(out)])) == 5 + 7
    loaded, problems = read_records([out])
    assert problems == [] and not any(name.endswith("gpu-check.json") for name, _ in loaded)
