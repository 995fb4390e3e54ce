"""Builds reference_results/sc25-pmbs.json from the published figures in this folder.

    .venv/bin/python reference_results/sources/sc25-pmbs/to_references.py

Numbers are copied as published (no rounding, no unit conversion); OOM cells become entries with
status "oom" and value null. What the slides leave open is said in each entry's provenance note.
The slides state neither the sequence length nor activation checkpointing, nor Model 2's node
count; the values in the configs below were INFERRED from the published figures by
infer_workloads.py in this folder, and each entry names them, with their evidence, under
provenance.inferred (they are what a run must match to be compared; the figures are as published).
tests/unit/test_references.py checks the JSON against these CSVs.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "sc25-pmbs.json"
SOURCE = ("A. Pérez Diéguez, À. Batlle Casellas, A. Torres-Camps, H. Teague, J. Ros-Giralt, "
          "'Pretraining LLMs at Scale: Tuning Strategies and Performance Portability', "
          "Qualcomm AI Research, SC'25 PMBS workshop (slides)")
SUBMITTER = "transcribed from the published slides by the suite maintainers"
DATE = "2025-11-17"
SYSTEMS = {
    "ib-a100": "InfiniBand 1.6 Tbps; 8x A100 per node, NVLink3 600 GB/s",
    "roce-a100": "RoCE 1.6 Tbps; 8x A100 per node, NVLink3 600 GB/s",
    "roce-h100": "RoCE 1.6 Tbps; 8x H100 per node, NVLink4 900 GB/s",
}
TOLERANCE_PCT = 5.0  # one published sample each: the tolerance a regression check starts from
MS_NOTE = "units not stated on the slide; milliseconds is the likely reading"
MODEL1 = "llama-440m"   # the paper's Model 1: 440M LLaMA-based, C = 1024
MODEL2 = "llama-8b-kd"  # the paper's Model 2: 8B LLaMA by distillation from an 8B teacher, C = 256

# What the slides do not state, as inferred from the published figures by infer_workloads.py (the
# suite's workloads carry the same values: conf/workload/llama-440m.yaml, llama-8b-kd.yaml).
INFERRED = "INFERRED, not stated in the slides (infer_workloads.py in this folder): "
MODEL1_WORKLOAD = {"seq_len": 128, "activation_checkpointing": False}
MODEL1_INFERRED = {
    "seq_len": INFERRED + "at seq 128 the published batch times imply 28-35 % of the A100's bf16 peak, "
               "at 256 56-70 %, at 512 over 100 %; the memory model calls all 10 published OOM cells "
               "right at 128 without checkpointing (8/10 at 256, 6/10 at 512)",
    "activation_checkpointing": INFERRED + "with checkpointing at seq 128 the memory model calls mb 512 "
                                "fitting, against the published OOM (8/10 cells right, 10/10 without); at "
                                "seq 512, where it calls 10/10, the cells would need 154-193 % of peak",
}
MODEL2_WORKLOAD = {"nodes": 2, "seq_len": 128, "activation_checkpointing": True}
MODEL2_INFERRED = {
    "nodes": INFERRED + "ib-a100 and roce-a100 have the same GPUs and NVLink yet their ZeRO-1 and ZeRO-3 "
             "cells differ by 12-25 %, so the runs crossed the inter-node fabric; Model 1 ran on 2 nodes; "
             "at 2 nodes the fastest A100 ZeRO-1/2 cells imply 13-15 % of the bf16 peak (1 node 26-30 %, "
             "4 nodes 6-7 %)",
    "seq_len": INFERRED + "with checkpointing the memory model calls 24/24 published cells (ok and OOM) "
               "right at seq 128, 15/24 at 256, 9/24 at 512",
    "activation_checkpointing": INFERRED + "without checkpointing the memory model calls at most 9 of the "
                                "24 published cells right at any sequence length (at 2 nodes every cell OOM)",
}


def rows(name: str) -> list[dict[str, str]]:
    with open(HERE / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def number(text: str) -> float | int:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def entry(platform: str, benchmark: str, config: dict, metric: str, text: str, unit: str,
          direction: str, status: str = "ok", note: str | None = None) -> dict:
    ok = status == "ok"
    value = number(text) if ok else None
    # what the slides leave out of this entry's configuration: the inferred values, marked as such
    workload, evidence = (MODEL1_WORKLOAD, MODEL1_INFERRED) if benchmark == MODEL1 else (MODEL2_WORKLOAD, MODEL2_INFERRED)
    unstated = [k for k in workload if k not in config]
    config = {**config, **{k: workload[k] for k in unstated}}
    inferred = {k: evidence[k] for k in unstated}
    return {"platform": platform, "benchmark": benchmark, "config": config, "metric": metric,
            "value": value, "unit": unit, "direction": direction, "tolerance_pct": TOLERANCE_PCT,
            "status": status, "num_samples": 1 if ok else 0, "samples": [value] if ok else [],
            "provenance": {"source": SOURCE, "submitter": SUBMITTER, "date": DATE,
                           "system": SYSTEMS[platform], "environment": None, "suite_commit": None,
                           "note": note, "inferred": inferred}}


def build() -> list[dict]:
    refs = []
    for r in rows("model1_ib-a100_batch_time.csv"):
        config = {"nodes": int(r["nodes"]), "zero_stage": int(r["zero_stage"]),
                  "micro_batch_size": int(r["batch_size"]), "grad_acc_steps": int(r["grad_acc"])}
        for metric, unit, note in (("batch_time_s", "s", "seconds per batch as published"),
                                   ("estimated_hours", "h", "estimated hours of the whole training, as published")):
            refs.append(entry(r["platform"], MODEL1, config, metric, r[metric], unit, "lower", r["status"], note))
    for r in rows("model1_ib-a100_stage1_phases.csv"):
        config = {"nodes": 2, "zero_stage": int(r["zero_stage"]), "micro_batch_size": int(r["batch_size"]),
                  "grad_acc_steps": int(r["grad_acc"])}
        for column in ("gradient_computation", "gradient_all_reduce", "optimizer_all_gather"):
            refs.append(entry(r["platform"], MODEL1, config, f"{column}_ms", r[column], "ms", "lower",
                              note=f"time per optimizer step averaged over 1024 samples; {MS_NOTE}"))
    for r in rows("model1_ib-a100_microsteps.csv"):
        ga = int(r["grad_acc"])
        config = {"nodes": 2, "zero_stage": int(r["zero_stage"]), "micro_batch_size": 1024 // ga,
                  "grad_acc_steps": ga, "microstep": int(r["microstep"])}
        for column in ("total", "computation", "communication"):
            refs.append(entry(r["platform"], MODEL1, config, f"microstep_{column}_ms", r[column], "ms", "lower",
                              note=f"one optimizer step, per backward micro-step; micro_batch_size derived "
                                   f"from C = 1024; {MS_NOTE}"))
    for r in rows("model2_step2_parallelism.csv"):
        config = {"zero_stage": int(r["zero_stage"]), "micro_batch_size": int(r["batch_size"]),
                  "grad_acc_steps": int(r["grad_acc"])}
        refs.append(entry(r["platform"], MODEL2, config, "samples_per_s", r["samples_per_s"], "samples/s",
                          "higher", r["status"], "tuning step 2 (parallelism); the node count is not stated (2 is inferred: "
                          "provenance.inferred)"))
    for r in rows("model2_step3_tuned.csv"):
        tuned = {"tuning": "tuned", "overlap_comm": r["overlap_comm"] == "true",
                 "gradient_collective": r["best_gradient_collective"]}
        refs.append(entry(r["platform"], MODEL2, {"tuning": "baseline"}, "samples_per_s",
                          r["baseline_samples_per_s"], "samples/s", "higher",
                          note="baseline before tuning step 3; the step-2 table reads 66.78 for "
                               "ib-a100, the step-3 table 65.78: both as published"))
        refs.append(entry(r["platform"], MODEL2, tuned, "samples_per_s", r["tuned_samples_per_s"],
                          "samples/s", "higher", note="after tuning step 3 (DeepSpeed communication knobs)"))
    return refs


if __name__ == "__main__":
    doc = {"schema_version": "1.0",
           "description": "Published figures of the SC'25 PMBS paper (sources/sc25-pmbs/), as published.",
           "references": build()}
    OUT.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({len(doc['references'])} references)")
