"""The performance model against published runs it never calibrated on (issue 28, item 2):
reference_results/sources/published-runs/cells.csv, measured throughput of DeepSpeed ZeRO-3 and
PyTorch FSDP (marked: full shard ~ ZeRO-3, SHARD_GRAD_OP ~ ZeRO-2) pretraining of LLaMA- and
GPT-like models on A100 and H100, 8 to 1024 GPUs, sequence 512 to 8192, each with its quote, URL and
date (SOURCES.md).

Each cell becomes a configuration of this suite (cell_overrides): the GPU's platform (A100: ib-a100,
H100: roce-h100, 8 GPUs a node, their declared peaks, memory and links; what a source states of its
GPU instead: an A100-40GB's memory and datasheet bandwidth, torchtitan's 96 GB H100 at 2.4 TB/s and a
peak between the NVL's and the SXM's, taken in the middle),
renamed published-a100/-h100 (not the paper's clusters: none of their unexplained ZeRO-3 cost), the
model's shape on the llama-8b workload (a GELU MLP of width f, two matrices, carried as a SwiGLU of
width 2f/3, three matrices: the same parameters and FLOPs), the sequence, micro-batch and
accumulation, checkpointing (full or stated for every layer: on; partial, K of L layers: every
L/K-th layer; op-level selective: sel; none, or selective at an unstated granularity: off, the nearest
this model has; cell_checkpointing), bf16, the ZeRO stage. It is predicted from the declared hardware and
the model's own terms alone: no record and no reference calibrates it (the efficiency is the GPU
roofline, perfmodel.roofline_efficiency, as for a user's new configuration). The error is against
the published figure in its own metric.
Pure, except load_cells (reads the CSV).
"""
from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from ..config.choices import CheckpointPolicy, Checkpointing, Fabric
from ..config.schema import REPO_ROOT, BenchConfig
from ..errors import HarnessError
from .calibration import calibrate
from .params import PARAMS, ModelParams
from .perfmodel import Prediction, executed_flops_per_step, predict

CELLS = REPO_ROOT / "reference_results" / "sources" / "published-runs" / "cells.csv"
PLATFORMS = {"A100": "ib-a100", "H100": "roce-h100"}
METRICS = ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu")
TARGETS = {"median_pct": 25.0, "max_ratio": 2.0}
"""Issue 28: median |error| <= 25 %, none off by more than 2x."""
CHECKPOINTED = ("yes", "true", "full")
GPUS_PER_NODE = 8
"""Every cell composes 8-GPU nodes (cell_overrides)."""


@dataclass(frozen=True)
class Cell:
    cell_id: str
    source_id: str
    framework: str
    zero_stage: int
    model: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    gpu_model: str
    gpu_mem_gb: Optional[int]
    num_gpus: int
    seq_len: int
    micro_batch: Optional[int]
    grad_acc: int
    checkpointing: str
    interconnect: str
    metric: str
    value: float
    notes: str
    hbm_tbps: Optional[float] = None
    """The GPU's memory bandwidth where the source states it (torchtitan's H100: 2.4 TB/s)."""
    peak_bf16: Optional[tuple[float, float]] = None
    """(low, high) dense bf16 TFLOP/s where the source bounds the peak ("between SXM and NVL")."""

    @property
    def gelu(self) -> bool:
        return self.model.lower().startswith("mpt") or "GELU" in self.notes


@dataclass
class CellPrediction:
    cell: Cell
    predicted: Optional[float]
    error_pct: Optional[float]
    why_not: Optional[str] = None
    efficiency_source: str = ""
    fits: Optional[bool] = None
    link_gbps: Optional[float] = None
    """The inter-node GB/s per node (per direction) the prediction used."""

    @property
    def link_stated(self) -> bool:
        """False: the source states no interconnect and the platform's own 8 x 200 Gb/s stood in."""
        return bool(self.cell.interconnect)


def _int(row: dict, key: str, default: Optional[int] = None) -> Optional[int]:
    text = (row.get(key) or "").strip()
    return int(float(text)) if text else default


def _float(row: dict, key: str) -> Optional[float]:
    text = (row.get(key) or "").strip()
    return float(text) if text else None


def _bounds(row: dict, key: str) -> Optional[tuple[float, float]]:
    """"low-high" (or one figure) -> (low, high)."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    low, _, high = text.partition("-")
    return float(low), float(high or low)


def load_cells(path: Path = CELLS) -> list[Cell]:
    """Every cell of the CSV; a malformed one stops with its id and column."""
    try:
        rows = list(csv.DictReader(path.read_text(encoding="utf-8").splitlines()))
    except OSError as e:
        raise HarnessError(f"{path}: cannot read the published runs ({e})") from None
    cells = []
    for row in rows:
        try:
            cells.append(Cell(row["cell_id"], row["source_id"], row["framework"], int(row["zero_stage"]), row["model"],
                              _int(row, "layers"), _int(row, "hidden"), _int(row, "heads"), _int(row, "kv_heads"),
                              _int(row, "ffn_hidden"), _int(row, "vocab"), row["gpu_model"], _int(row, "gpu_mem_gb"),
                              _int(row, "num_gpus"), _int(row, "seq_len"), _int(row, "micro_batch"),
                              _int(row, "grad_acc", 1), row["activation_checkpointing"].strip(),
                              (row.get("interconnect") or "").strip(), row["metric"],
                              float(row["value"]), row.get("notes") or "", _float(row, "gpu_hbm_tbps"),
                              _bounds(row, "gpu_peak_tflops_bf16")))
        except (KeyError, ValueError, TypeError) as e:
            raise HarnessError(f"{path}: cell {row.get('cell_id')!r}: {e}") from None
    return cells


_PER_GPU = re.compile(r"(\d+(?:\.\d+)?)\s*Gb(?:ps|/s)[\w ]*? per GPU", re.I)
_PER_NODE = re.compile(r"(\d+(?:\.\d+)?)\s*Gb(?:ps|/s)", re.I)


def declared_link(c: Cell) -> Optional[tuple[str, float]]:
    """(fabric, GB/s per node per direction) of the inter-node network the cell's source states, or
    None where it states none. "N Gb/s [...] per GPU" counts 8 GPUs a node (the platform's), any other
    "N Gbps" is the node's total (llm-foundry's "1600 Gbps node-node", IBM's "400Gbps inter-node").
    The fabric is InfiniBand where the source says so, else RoCE; off the paper's clusters both run at
    line rate (params.fabric_efficiency), so the word only labels the row."""
    text = c.interconnect
    if not text:
        return None
    fabric = "ib" if re.search(r"infiniband|\bHDR\b|\bNDR\b", text, re.I) else "roce"
    m = _PER_GPU.search(text)
    if m:
        return fabric, float(m.group(1)) * GPUS_PER_NODE / 8
    m = _PER_NODE.search(text)
    if m is None:
        raise HarnessError(f"{c.cell_id}: no bandwidth in the stated interconnect {text!r}")
    return fabric, float(m.group(1)) / 8


_PARTIAL = re.compile(r"partial:\s*(\d+)\s+of\s+(\d+)\s+layers", re.I)


def cell_checkpointing(c: Cell) -> Optional[tuple[int, str]]:
    """(every n-th layer, policy) of the cell's activation checkpointing, or None without: full (or
    stated for every layer) (1, full); "partial: K of L layers" (L / K, full) (YaFSDP's num-ckpt-layers,
    evenly spaced as transformers' every_n_layers spaces them); "selective" or "selective (op-level)"
    (1, selective: torchtitan's op policy, benchmarks/training/checkpoint_policy.py). Layer-level selective and
    IBM's every n-th block, at an unstated n: None, the nearest this model has."""
    text = c.checkpointing.lower()
    if text.startswith(CHECKPOINTED):
        return 1, "full"
    if text in ("selective", "selective (op-level)"):
        return 1, "selective"
    m = _PARTIAL.match(text)
    if m is None:
        return None
    k, layers = int(m.group(1)), int(m.group(2))
    if k < 1 or layers != c.layers or layers % k:
        raise HarnessError(f"{c.cell_id}: checkpointing {c.checkpointing!r} is not every n-th of its {c.layers} layers")
    return layers // k, "full"


def cell_overrides(c: Cell) -> list[str]:
    """The Hydra overrides of this suite's configuration for the cell (see the module's text)."""
    family = next((k for k in PLATFORMS if c.gpu_model.upper().startswith(k)), None)
    if family is None:
        raise HarnessError(f"{c.cell_id}: no platform of this suite for GPU {c.gpu_model}")
    if c.micro_batch is None:
        raise HarnessError(f"{c.cell_id}: the source states no micro-batch")
    if c.num_gpus % GPUS_PER_NODE:
        raise HarnessError(f"{c.cell_id}: {c.num_gpus} GPUs is not whole {GPUS_PER_NODE}-GPU nodes")
    ffn = round(2 * c.ffn_hidden / 3) if c.gelu else c.ffn_hidden
    ckpt = cell_checkpointing(c)
    every, policy = ckpt or (1, "full")
    checkpointing = Checkpointing(ckpt is not None, every, CheckpointPolicy(policy))
    out = [f"platform={PLATFORMS[family]}", f"platform.name=published-{family.lower()}",  # not the paper's cluster
           f"platform.nodes={c.num_gpus // GPUS_PER_NODE}", "workload=llama-8b",
           f"workload.hidden_size={c.hidden}", f"workload.num_layers={c.layers}", f"workload.num_heads={c.heads}",
           f"workload.num_kv_heads={c.kv_heads}", f"workload.intermediate_size={ffn}", f"workload.vocab_size={c.vocab}",
           f"workload.seq_len={c.seq_len}", f"workload.samples_per_step={c.micro_batch * c.grad_acc}",
           f"workload.micro_batch_size={c.micro_batch}", "workload.precision=bf16",
           *checkpointing.overrides(), f"zero=stage{c.zero_stage}", "suite=single"]
    if c.gpu_mem_gb is not None and c.gpu_mem_gb != 80:      # the platforms' parts are 80 GB
        out.append(f"platform.mem_per_device_gib={float(c.gpu_mem_gb)}")
        if family == "A100" and c.gpu_mem_gb == 40:           # its own datasheet bandwidth (params.hbm_gbps)
            out.append("platform.gpu_model=A100-SXM4-40GB")
    if c.hbm_tbps is not None:
        out.append(f"platform.hbm_gbps={c.hbm_tbps * 1000:g}")
    if c.peak_bf16 is not None:                               # the middle of the stated bounds
        out.append(f"platform.peak_tflops.bf16={sum(c.peak_bf16) / 2:g}")
    link = declared_link(c)
    if link is not None:     # else the platform's own 8 x 200 Gb/s, said in the table
        out += [f"platform.fabric={link[0]}", f"platform.inter_node_bw_gbps={link[1]:g}"]
    return out


def metric_of(pred: Prediction, cfg: BenchConfig, metric: str) -> float:
    n = cfg.platform.world_size
    if metric == "tokens_per_s_per_gpu":
        return pred.tokens_per_s / n
    if metric == "step_time_s":
        return pred.step_time_s
    if metric == "tflops_per_gpu":   # hardware FLOPs (recomputation counted), as Megatron's formula counts them
        return executed_flops_per_step(cfg) / pred.step_time_s / 1e12
    raise HarnessError(f"metric {metric!r} is not one the model predicts ({', '.join(METRICS)})")


def predict_cells(compose: Callable[[list[str]], BenchConfig], cells: Optional[list[Cell]] = None,
                  params: ModelParams = PARAMS) -> list[CellPrediction]:
    out = []
    for c in load_cells() if cells is None else cells:
        try:
            cfg = compose(cell_overrides(c))
        except HarnessError as e:
            out.append(CellPrediction(c, None, None, why_not=str(e).split("\n")[0]))
            continue
        pred = predict(cfg, calibrate([], cfg, [], params), params=params)
        value = metric_of(pred, cfg, c.metric)
        out.append(CellPrediction(c, value, 100.0 * (value - c.value) / c.value, efficiency_source=pred.efficiency_source,
                                  fits=pred.memory.fits, link_gbps=cfg.platform.inter_node_bw_gbps))
    return out


LINK_LADDER = ((25.0, "1 x 200 Gb/s"), (50.0, "2 x 200 Gb/s"), (100.0, "4 x 200 Gb/s"), (200.0, "8 x 200 Gb/s"),
               (400.0, "8 x 400 Gb/s"))
"""Common NIC complements of an 8-GPU node, as GB/s per node per direction: what implied_links tries."""


@dataclass(frozen=True)
class ImpliedLink:
    source_id: str
    cells: int
    assumed_median_pct: float
    gbps: float
    nics: str
    median_pct: float
    errors_pct: tuple[float, ...]


def implied_links(compose: Callable[[list[str]], BenchConfig], rows: list[CellPrediction],
                  params: ModelParams = PARAMS) -> list[ImpliedLink]:
    """For each source that states no interconnect: the node link of LINK_LADDER at which the model's
    median |error| over that source's multi-node cells is least. A diagnostic, never an input: no
    figure of the table, its statistics or its targets uses it. One link that brings every cell of a
    source close says the mechanisms hold and only the undeclared network is missing; none that does
    says a mechanism is."""
    out = []
    for source in sorted({p.cell.source_id for p in rows}):
        mine = [p for p in rows if p.cell.source_id == source and p.predicted is not None and not p.link_stated
                and p.cell.num_gpus > GPUS_PER_NODE]
        if not mine:
            continue
        bases = [compose(cell_overrides(p.cell)) for p in mine]
        tried = []
        for gbps, nics in LINK_LADDER:
            errs = []
            for p, base in zip(mine, bases):
                cfg = replace(base, platform=replace(base.platform, fabric=Fabric.roce, inter_node_bw_gbps=gbps))
                value = metric_of(predict(cfg, calibrate([], cfg, [], params), params=params), cfg, p.cell.metric)
                errs.append(100.0 * (value - p.cell.value) / p.cell.value)
            tried.append((statistics.median(abs(e) for e in errs), gbps, nics, tuple(errs)))
        best = min(tried)
        out.append(ImpliedLink(source, len(mine), statistics.median(abs(p.error_pct) for p in mine), best[1], best[2],
                               best[0], best[3]))
    return out


def format_implied(links: list[ImpliedLink]) -> list[str]:
    if not links:
        return []
    lines = ["", "  sources that state no interconnect (link column '?': the platform's 8 x 200 Gb/s stood in); the node "
                 "link that would bring their multi-node cells closest (a diagnostic: no figure above uses it):"]
    for k in links:
        lines.append(f"    {k.source_id}: {k.cells} cells, median |error| {k.assumed_median_pct:.0f} % as assumed; at "
                     f"{k.gbps:g} GB/s per node ({k.nics}) {k.median_pct:.0f} % "
                     f"(each {min(k.errors_pct):+.0f}..{max(k.errors_pct):+.0f} %)")
    return lines


def as_dict(p: CellPrediction) -> dict:
    return {"cell_id": p.cell.cell_id, "source_id": p.cell.source_id, "metric": p.cell.metric,
            "published": p.cell.value, "predicted": p.predicted, "error_pct": p.error_pct, "why_not": p.why_not,
            "fits": p.fits, "efficiency_source": p.efficiency_source}


def ratio(p: CellPrediction) -> float:
    """How far off, as a factor >= 1 (either way)."""
    assert p.predicted is not None
    r = p.predicted / p.cell.value
    return max(r, 1 / r) if r > 0 else float("inf")


def summary(rows: list[CellPrediction]) -> tuple[float, float, int]:
    """(median |error| %, max |error| %, cells off by more than the target factor) of the predicted cells."""
    errs = [abs(p.error_pct) for p in rows if p.error_pct is not None]
    return (statistics.median(errs), max(errs), sum(1 for p in rows if p.predicted is not None and ratio(p) > TARGETS["max_ratio"])) \
        if errs else (0.0, 0.0, 0)


SCALE_BANDS = ((1, 8, "1 node"), (9, 64, "2-8 nodes"), (65, 256, "9-32 nodes"), (257, 1 << 30, "33+ nodes"))
"""GPU counts by node count (8 GPUs a node), for the by-scale line (issue 28, item 3)."""


def by_scale(rows: list[CellPrediction]) -> list[tuple[str, int, float, float]]:
    """(band, cells, median |error| %, median signed error %) per SCALE_BANDS band with cells: does
    the error grow with the node count (the topology at scale)?"""
    out = []
    for lo, hi, name in SCALE_BANDS:
        errs = [p.error_pct for p in rows if p.error_pct is not None and lo <= p.cell.num_gpus <= hi]
        if errs:
            out.append((name, len(errs), statistics.median(abs(e) for e in errs), statistics.median(errs)))
    return out


def format_cells(rows: list[CellPrediction]) -> list[str]:
    lines = ["", "Published runs the model never calibrated on (reference_results/sources/published-runs/):",
             f"{'cell':<14}{'framework':<10}{'ZeRO':>5}{'GPU':>11}{'GPUs':>6}{'seq':>6}{'mb':>4}{'ckpt':>6}"
             f"{'link':>6}{'metric':>22}{'published':>11}{'model':>10}{'err %':>8}"]
    for p in rows:
        c = p.cell
        model = f"{p.predicted:.4g}" if p.predicted is not None else "-"
        err = f"{p.error_pct:+.0f}" if p.error_pct is not None else "-"
        of = cell_checkpointing(c)
        ckpt = "off" if of is None else "sel" if of[1] == "selective" else "on" if of[0] == 1 else f"1/{of[0]}"
        link = "-" if p.link_gbps is None else f"{p.link_gbps:g}" + ("" if p.link_stated else "?")
        lines.append(f"{c.cell_id:<14}{c.framework:<10}{c.zero_stage:>5}{c.gpu_model:>11}{c.num_gpus:>6}{c.seq_len:>6}"
                     f"{c.micro_batch if c.micro_batch else '-':>4}{ckpt:>6}{link:>6}{c.metric:>22}{c.value:>11.4g}{model:>10}"
                     f"{err:>8}" + (f"  ({p.why_not})" if p.why_not else "") + ("  [OOM by the model]" if p.fits is False else ""))
    done = [p for p in rows if p.predicted is not None]
    if done:
        med, worst, off = summary(done)
        sources = len({p.cell.source_id for p in done})
        lines += ["", f"  {len(done)} cells of {sources} sources predicted ({len(rows) - len(done)} not: said above); "
                      f"median |error| {med:.0f} %, max {worst:.0f} %, {off} off by more than {TARGETS['max_ratio']:g}x",
                  "  by scale: " + "; ".join(f"{name} {n} cells, median |error| {m:.0f} % (signed {b:+.0f} %)"
                                            for name, n, m, b in by_scale(done)),
                  f"  [{'ok' if med <= TARGETS['median_pct'] else 'MISSED'}] median |error| <= "
                  f"{TARGETS['median_pct']:g} % (issue 28)",
                  f"  [{'ok' if not off else 'MISSED'}] none off by more than {TARGETS['max_ratio']:g}x (issue 28)",
                  "  (not part of --validate's exit status until the model's mechanisms meet them; the efficiency: "
                  + "; ".join(f"{src} [{', '.join(sorted({p.cell.gpu_model for p in done if p.efficiency_source == src}))}]"
                              for src in sorted({p.efficiency_source for p in done})) + ")"]
    return lines
