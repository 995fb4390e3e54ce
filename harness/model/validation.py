"""`python -m harness model --validate`: the performance model against every published cell of
the SC'25 PMBS tables (reference_results/sc25-pmbs.json), with no cell calibrating its own
prediction.

For every published cell of the Model 1 batch-time table and the Model 2 step-2 table:
- the out-of-memory call (memory model) against the published status;
- leave-one-out: the prediction with the computation efficiency calibrated on every OTHER
  published cell of the same platform and workload (the cell's own entries, all metrics, removed);
- one cell per platform: calibrated on the ZeRO-1 baseline cell alone (the tuning baseline);
then the error per cell (Model 1: batch time; Model 2: samples/s), the median and max per table,
and each published finding marked reproduced or not, with the numbers.
The model's global parameters (harness/model/params.py) are fixed while validating; they were
fitted to these tables once (reference_results/sources/sc25-pmbs/fit_model.py).
Pure, except load_published (reads the reference file).
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..config.choices import GradientCollective
from ..config.schema import REPO_ROOT, BenchConfig
from ..config.split import with_split
from ..errors import HarnessError
from ..verdict.references import Reference, load_file
from .calibration import calibrate, is_outlier
from .memory import memory_estimate
from .params import PARAMS, ModelParams
from .perfmodel import Prediction, predict
from .traffic import comm_traffic

PUBLISHED = REPO_ROOT / "reference_results" / "sc25-pmbs.json"
TABLES = {"model1": ("llama-440m", "batch_time_s"), "model2": ("llama-8b-kd", "samples_per_s")}
BASELINE = {"model1": (1, 64), "model2": (1, 64)}
"""(ZeRO stage, micro-batch) of the cell that calibrates the one-cell-per-platform predictions."""
TARGETS = {"oom_right": 34, "model2_loo_median_pct": 10.0, "model2_loo_over25": 2, "model1_loo_median_pct": 10.0,
           "model2_one_cell_median_pct": 20.0}
"""Issue 13's targets: OOM calls all right; Model 2 leave-one-out median |error| <= 10 % with at most 2
cells above 25 %; Model 1 leave-one-out median <= 10 %; one cell per platform: Model 2 median <= 20 %."""


@dataclass
class CellResult:
    table: str
    platform: str
    benchmark: str
    zero_stage: int
    micro_batch_size: int
    grad_acc_steps: int
    metric: str
    published: Optional[float]
    """The published value (None for an OOM cell)."""
    status: str
    predicted_mem_gib: float
    capacity_gib: float
    oom_right: bool
    loo: Optional[float] = None
    """Leave-one-out prediction of the metric."""
    loo_error_pct: Optional[float] = None
    one_cell: Optional[float] = None
    one_cell_error_pct: Optional[float] = None
    """None for the calibrating cell itself (it would be 0 by construction)."""
    outlier: bool = False


@dataclass
class TableSummary:
    table: str
    metric: str
    cells: int
    oom_right: int
    loo_median_pct: float
    loo_max_pct: float
    loo_over25: int
    one_cell_median_pct: float
    one_cell_max_pct: float


@dataclass
class Finding:
    name: str
    published: str
    model: str
    reproduced: bool
    explanation: str = ""


@dataclass
class Target:
    name: str
    value: float
    threshold: float
    ok: bool


@dataclass
class Validation:
    cells: list[CellResult]
    tables: list[TableSummary]
    findings: list[Finding]
    targets: list[Target]
    params: list[dict[str, Any]]
    outlier_treatment: str
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.targets)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def load_published(path: Optional[Path] = None) -> list[Reference]:
    path = PUBLISHED if path is None else path
    if not path.is_file():
        raise HarnessError(f"--validate needs the paper's published table {path} (reference_results/sc25-pmbs.json, "
                           "built by reference_results/sources/sc25-pmbs/to_references.py); it is not in this checkout")
    return load_file(path)


def _cell_of(r: Reference) -> tuple[str, str, int, int]:
    return (r.platform, r.benchmark, int(r.config.get("zero_stage", -1)), int(r.config.get("micro_batch_size", -1)))


def _metric_of(pred: Prediction, metric: str) -> float:
    return pred.samples_per_s if metric == "samples_per_s" else pred.step_time_s / pred.config["grad_acc_steps"]


def _err(pred: float, published: float) -> float:
    return 100.0 * (pred / published - 1.0)


def _summary(table: str, metric: str, rows: list[CellResult]) -> TableSummary:
    loo = [abs(r.loo_error_pct) for r in rows if r.loo_error_pct is not None]
    one = [abs(r.one_cell_error_pct) for r in rows if r.one_cell_error_pct is not None]
    return TableSummary(table, metric, len(rows), sum(r.oom_right for r in rows),
                        statistics.median(loo) if loo else 0.0, max(loo, default=0.0), sum(e > 25 for e in loo),
                        statistics.median(one) if one else 0.0, max(one, default=0.0))


def validate_model(compose: Callable[[list[str]], BenchConfig], refs: Optional[list[Reference]] = None,
                   params: ModelParams = PARAMS) -> Validation:
    """Every published cell: OOM call, leave-one-out and one-cell-per-platform predictions, the
    per-table statistics, the findings and the targets. `compose` builds a configuration from
    Hydra overrides (harness.config.compose)."""
    refs = load_published() if refs is None else refs
    bases: dict[tuple[str, str], BenchConfig] = {}
    results: list[CellResult] = []
    preds: dict[tuple[str, str, int, int], Prediction] = {}
    for table, (benchmark, metric) in TABLES.items():
        cells = [r for r in refs if r.benchmark == benchmark and r.metric == metric and "micro_batch_size" in r.config]
        if not cells:
            raise HarnessError(f"the published table has no {benchmark} {metric} entries: not the paper's table")
        for r in cells:
            key = (r.platform, benchmark)
            if key not in bases:
                bases[key] = compose([f"platform={r.platform}", f"workload={benchmark}", "suite=single"])
            cfg = with_split(bases[key], int(r.config["zero_stage"]), int(r.config["micro_batch_size"]))
            mem = memory_estimate(cfg)
            row = CellResult(table, r.platform, benchmark, cfg.zero.stage, cfg.workload.micro_batch_size,
                             cfg.workload.grad_acc_steps, metric, r.value, r.status, mem.total_gib, mem.capacity_gib,
                             mem.fits == (r.status == "ok"), outlier=is_outlier(r, params.outliers))
            results.append(row)
            if r.status != "ok":
                continue
            others = [o for o in refs if _cell_of(o) != _cell_of(r)]
            pred = predict(cfg, calibrate([], cfg, others, params), params=params)
            preds[_cell_of(r)] = pred
            row.loo = _metric_of(pred, metric)
            row.loo_error_pct = _err(row.loo, r.value)
            stage, mb = BASELINE[table]
            if (row.zero_stage, row.micro_batch_size) != (stage, mb):
                base = [o for o in refs if _cell_of(o) == (r.platform, benchmark, stage, mb) and o.metric == metric]
                row.one_cell = _metric_of(predict(cfg, calibrate([], cfg, base, params), params=params), metric)
                row.one_cell_error_pct = _err(row.one_cell, r.value)
    tables = [_summary(t, m, [c for c in results if c.table == t]) for t, (_, m) in TABLES.items()]
    findings = _findings(results, preds, bases, refs, params)
    t1, t2 = tables
    targets = [Target("OOM calls right (of 34)", t1.oom_right + t2.oom_right, TARGETS["oom_right"],
                      t1.oom_right + t2.oom_right >= TARGETS["oom_right"]),
               Target("Model 2 samples/s, leave-one-out median |error| %", t2.loo_median_pct,
                      TARGETS["model2_loo_median_pct"], t2.loo_median_pct <= TARGETS["model2_loo_median_pct"]),
               Target("Model 2 cells above 25 % (leave-one-out)", t2.loo_over25, TARGETS["model2_loo_over25"],
                      t2.loo_over25 <= TARGETS["model2_loo_over25"]),
               Target("Model 1 batch time, leave-one-out median |error| %", t1.loo_median_pct,
                      TARGETS["model1_loo_median_pct"], t1.loo_median_pct <= TARGETS["model1_loo_median_pct"]),
               Target("Model 2 samples/s, one cell per platform, median |error| %", t2.one_cell_median_pct,
                      TARGETS["model2_one_cell_median_pct"],
                      t2.one_cell_median_pct <= TARGETS["model2_one_cell_median_pct"])]
    outlier = ("roce-a100 ZeRO-2 mb 64 (25.74 samples/s, 2.4x below ib-a100's 62.13 and 2.3x below roce-a100's own "
               "ZeRO-1 at mb 64) is an outlier of the paper's own: it never calibrates another cell "
               "(model_params.outliers), and it is still predicted and counted in every statistic")
    return Validation(results, tables, findings, targets, [asdict(p) for p in params.table()], outlier)


# ---- findings --------------------------------------------------------------------------------

def _pub(refs: list[Reference], platform: str, benchmark: str, metric: str, stage: int, mb: int) -> Optional[float]:
    for r in refs:
        if _cell_of(r) == (platform, benchmark, stage, mb) and r.metric == metric and r.status == "ok":
            return r.value
    return None


def _findings(rows: list[CellResult], preds: dict, bases: dict, refs: list[Reference],
              params: ModelParams) -> list[Finding]:
    m1 = {(c.zero_stage, c.micro_batch_size): c for c in rows if c.table == "model1" and c.status == "ok"}
    m2 = [c for c in rows if c.table == "model2" and c.status == "ok"]
    out = []
    # takeaway 1: under ZeRO-1 the largest micro-batch is not the fastest (Model 1)
    z1 = {mb: c for (s, mb), c in m1.items() if s == 1}
    largest = max(z1)
    hours = {mb: _pub(refs, "ib-a100", "llama-440m", "estimated_hours", 1, mb) for mb in z1}
    pub_fast = min(hours, key=lambda mb: hours[mb])
    model_fast = min(z1, key=lambda mb: z1[mb].loo * z1[mb].grad_acc_steps)
    steps = ", ".join(f"mb {mb}: {z1[mb].published * z1[mb].grad_acc_steps:.3f} s" for mb in sorted(z1))
    out.append(Finding(
        "takeaway 1: under ZeRO-1 the largest micro-batch is not the fastest (Model 1)",
        f"fastest by estimated hours: mb {pub_fast} ({hours[pub_fast]} h) vs mb {largest} ({hours[largest]} h); "
        f"published step times (batch time x grad-acc): {steps}",
        f"fastest by predicted step time: mb {model_fast} ("
        + ", ".join(f"mb {mb}: {z1[mb].loo * z1[mb].grad_acc_steps:.3f} s" for mb in sorted(z1)) + ")",
        model_fast != largest,
        "" if model_fast != largest else
        f"the published margin is {100 * (hours[largest] / hours[pub_fast] - 1):.2f} % in hours, and the published "
        "batch times order mb 256 first (by 0.25 %): both below the 3-digit rounding of the batch times (+-0.25 %) "
        "and the model's leave-one-out error; the data cannot support this finding at Model 1's sizes"))
    # takeaway 2: ZeRO-1 / ZeRO-2 crossover (Model 1)
    pairs = sorted(mb for (s, mb) in m1 if s == 1 and (2, mb) in m1)
    pub_z2 = [mb for mb in pairs if m1[(2, mb)].published < m1[(1, mb)].published]
    mod_z2 = [mb for mb in pairs if m1[(2, mb)].loo < m1[(1, mb)].loo]
    diffs = ", ".join(f"mb {mb} (ga {m1[(1, mb)].grad_acc_steps}): {100 * (m1[(2, mb)].published / m1[(1, mb)].published - 1):+.1f} %"
                      for mb in pairs)
    mdiffs = ", ".join(f"mb {mb}: {100 * (m1[(2, mb)].loo / m1[(1, mb)].loo - 1):+.1f} %" for mb in pairs)
    crossover = bool(mod_z2) and mod_z2 == pub_z2
    out.append(Finding(
        "takeaway 2: ZeRO-2 beats ZeRO-1 at small grad-acc, ZeRO-1 wins at large (Model 1)",
        f"ZeRO-2 vs ZeRO-1 batch time: {diffs}", f"ZeRO-2 vs ZeRO-1 predicted: {mdiffs}", crossover,
        "" if crossover else
        "in DeepSpeed 0.19.8 ZeRO-2 issues the same bucket all-reduce as ZeRO-1 on every micro-step instead of once "
        "(overlap_comm is off by default for ZeRO-1/2 and 440M parameters fill one 5e8-element bucket, reduced when "
        "backward ends), so at the same micro-batch nothing makes ZeRO-2 cheaper; the published ZeRO-2 advantage at "
        "ga 8 and 4 (1.3 % and 4.3 %) is within the paper's run-to-run spread (its own ZeRO-2 micro-step table shows "
        "+-5 % between micro-steps). The paper's ZeRO-2 micro-step table is not the batch-time table's ZeRO-2 mb 128: "
        "its 8 backward micro-steps alone take 3.78 s where that cell's whole step takes 3.14 s, and its 450 ms of "
        "computation per micro-step is ZeRO-1's mb-256 gradient computation (452.8 ms), not mb 128's (233.8 ms)"))
    # takeaway 3: micro-step shape, ZeRO-1 communicates only at the boundary, ZeRO-2 every micro-step
    base = bases[("ib-a100", "llama-440m")]
    shape = {}
    for stage in (1, 2):
        cfg = with_split(base, stage, 128)
        grads = [t for t in comm_traffic(cfg) if t.phase == "backward"]
        shape[stage] = (grads[0].microsteps if grads else 0, cfg.workload.grad_acc_steps)
    p1 = preds.get(("ib-a100", "llama-440m", 1, 128))
    ar = sum(c.total_time_s for c in p1.comm if c.phase == "backward") * 1e3 if p1 else float("nan")
    p2 = preds.get(("ib-a100", "llama-440m", 2, 128))
    ar2 = sum(c.time_s * c.count / c.microsteps for c in p2.comm if c.phase == "backward") * 1e3 if p2 else float("nan")
    ok3 = shape[1][0] == 1 and shape[2][0] == shape[2][1]
    out.append(Finding(
        "takeaway 3: ZeRO-1 communicates only in the last micro-step, ZeRO-2 in every one (Model 1, ga 8)",
        "ZeRO-1: 54.25 ms in micro-step 7 only; ZeRO-2: 12.7-24.9 ms in each of the 8",
        f"ZeRO-1 gradient collectives in {shape[1][0]} of {shape[1][1]} micro-steps ({ar:.1f} ms); ZeRO-2 in "
        f"{shape[2][0]} of {shape[2][1]} ({ar2:.1f} ms each)", ok3,
        f"the shape is reproduced; the times differ: the model's boundary all-reduce of the 880 MB of gradients at the "
        f"IB line rate takes {ar:.1f} ms, the paper's phase table gives 16.78 ms for it and its micro-step table "
        "54.25 ms (two published figures of the same collective, 3x apart)"))
    # ZeRO-2 at grad_acc 2 (mb 128) best on every platform (Model 2)
    best_pub, best_mod = {}, {}
    for plat in sorted({c.platform for c in m2}):
        cs = [c for c in m2 if c.platform == plat]
        best_pub[plat] = max(cs, key=lambda c: c.published)
        best_mod[plat] = max(cs, key=lambda c: c.loo)
    ok4 = all((b.zero_stage, b.grad_acc_steps) == (2, 2) for b in best_mod.values())
    out.append(Finding(
        "ZeRO-2 at grad_acc 2 is the best step-2 configuration on every platform (Model 2)",
        "; ".join(f"{p}: ZeRO-{b.zero_stage} mb {b.micro_batch_size} ({b.published} samples/s)" for p, b in best_pub.items()),
        "; ".join(f"{p}: ZeRO-{b.zero_stage} mb {b.micro_batch_size} ({b.loo:.1f})" for p, b in best_mod.items()), ok4))
    # ZeRO-3's slowdown at the same micro-batch (Model 2)
    ratios_p, ratios_m = [], []
    for plat in sorted(best_pub):
        for mb, stage in ((64, 1), (128, 2)):
            a = next((c for c in m2 if (c.platform, c.zero_stage, c.micro_batch_size) == (plat, stage, mb)), None)
            b = next((c for c in m2 if (c.platform, c.zero_stage, c.micro_batch_size) == (plat, 3, mb)), None)
            if a and b and not a.outlier:
                ratios_p.append((plat, mb, a.published / b.published))
                ratios_m.append(a.loo / b.loo)
    mean_p = statistics.fmean(r for *_, r in ratios_p) if ratios_p else 0.0
    mean_m = statistics.fmean(ratios_m) if ratios_m else 0.0
    ok5 = bool(ratios_m) and min(ratios_m) >= 1.5 and abs(mean_m / mean_p - 1) <= 0.25
    out.append(Finding(
        "ZeRO-3 is 2-3x slower than ZeRO-1/2 at the same micro-batch (Model 2)",
        ", ".join(f"{p} mb {mb}: {r:.2f}x" for p, mb, r in ratios_p) + f" (mean {mean_p:.2f}x)",
        ", ".join(f"{p} mb {mb}: {m:.2f}x" for (p, mb, _), m in zip(ratios_p, ratios_m)) + f" (mean {mean_m:.2f}x)", ok5,
        "criterion: every predicted ratio at least 1.5x and their mean within 25 % of the published mean"))
    # H100 vs A100 (the same RoCE fabric): best step-2 cell
    h, a = best_pub.get("roce-h100"), best_pub.get("roce-a100")
    if h and a:
        hp, ap = (next(c for c in m2 if (c.platform, c.zero_stage, c.micro_batch_size) == (x.platform, 2, 128)) for x in (h, a))
        pub, mod = hp.published / ap.published, hp.loo / ap.loo
        ok6 = abs(mod / pub - 1) <= 0.15
        out.append(Finding(
            "H100 trains about 1.85x faster than A100 (Model 2, ZeRO-2 mb 128, RoCE)",
            f"{hp.published} / {ap.published} = {pub:.2f}x (the slides: 1.85x)",
            f"{hp.loo:.1f} / {ap.loo:.1f} = {mod:.2f}x", ok6,
            "" if ok6 else "criterion: within 15 % of the published ratio"))
    out.append(_step3_finding(m2, bases, refs, params))
    return out


def _step3_finding(m2: list[CellResult], bases: dict, refs: list[Reference], params: ModelParams) -> Finding:
    """The sign of tuning step 3's gain: the tuned knobs (gradient collective reduce_scatter, the
    published overlap_comm) on the step-2 winner (ZeRO-2 mb 128), against that cell untuned."""
    pub, mod = [], []
    for plat in sorted({c.platform for c in m2}):
        tuned = next((r for r in refs if r.platform == plat and r.benchmark == "llama-8b-kd"
                      and r.config.get("tuning") == "tuned"), None)
        z2 = next((c for c in m2 if (c.platform, c.zero_stage, c.micro_batch_size) == (plat, 2, 128)), None)
        if tuned is None or z2 is None:
            continue
        cfg = with_split(bases[(plat, "llama-8b-kd")], 2, 128)
        calib = calibrate([], cfg, refs, params)
        knobs = dataclasses.replace(cfg.zero, overlap_comm=bool(tuned.config.get("overlap_comm")),
                                    gradient_collective=GradientCollective(tuned.config.get("gradient_collective", "all_reduce")))
        base_sps = predict(cfg, calib, params=params).samples_per_s
        tuned_sps = predict(dataclasses.replace(cfg, zero=knobs), calib, params=params).samples_per_s
        pub.append(f"{plat}: {tuned.value} vs ZeRO-2 mb 128 {z2.published} ({_err(tuned.value, z2.published):+.1f} %)")
        mod.append((plat, _err(tuned_sps, base_sps)))
    ok = bool(mod) and all(g > 0 for _, g in mod)
    return Finding("tuning step 3 (reduce-scatter, overlap_comm as published) gains over ZeRO-2 mb 128 (Model 2)",
                   "; ".join(pub), "; ".join(f"{p}: {g:+.1f} %" for p, g in mod), ok,
                   "the sign is the criterion; the model's gain is the halved gradient bytes of the balanced reduce-scatter "
                   "(and overlap), the paper's is larger: its per-collective costs are larger than the fitted fabric "
                   "bandwidths give" if ok else "the model predicts no gain from the tuned knobs")


# ---- text ------------------------------------------------------------------------------------

def format_validation(v: Validation) -> str:
    lines = ["The performance model against the published SC'25 PMBS tables (no cell calibrates its own prediction)", ""]
    lines.append(f"{'table':<7}{'platform':<11}{'ZeRO':>5}{'mb':>5}{'ga':>4}{'mem GiB':>9}{'of':>6} {'OOM call':<9}"
                 f"{'published':>10}{'LOO':>9}{'err %':>8}{'1-cell':>9}{'err %':>8}")
    for c in v.cells:
        call = ("ok" if c.oom_right else "WRONG") + ("" if c.status == "ok" else " (oom)")
        pub = f"{c.published:.4g}" if c.published is not None else "OOM"
        loo = f"{c.loo:.4g}" if c.loo is not None else "-"
        le = f"{c.loo_error_pct:+.1f}" if c.loo_error_pct is not None else "-"
        one = f"{c.one_cell:.4g}" if c.one_cell is not None else ("calib" if c.status == "ok" else "-")
        oe = f"{c.one_cell_error_pct:+.1f}" if c.one_cell_error_pct is not None else "-"
        lines.append(f"{c.table:<7}{c.platform:<11}{c.zero_stage:>5}{c.micro_batch_size:>5}{c.grad_acc_steps:>4}"
                     f"{c.predicted_mem_gib:>9.1f}{c.capacity_gib:>6.1f} {call:<9}{pub:>10}{loo:>9}{le:>8}{one:>9}{oe:>8}"
                     + ("  outlier" if c.outlier else ""))
    lines += ["", "per table (|error| %):"]
    for t in v.tables:
        lines.append(f"  {t.table} {t.metric}: OOM calls {t.oom_right}/{t.cells}; leave-one-out median {t.loo_median_pct:.1f}, "
                     f"max {t.loo_max_pct:.1f}, {t.loo_over25} above 25 %; one cell per platform median "
                     f"{t.one_cell_median_pct:.1f}, max {t.one_cell_max_pct:.1f}")
    lines += ["", "findings:"]
    for f in v.findings:
        lines += [f"  [{'reproduced' if f.reproduced else 'NOT reproduced'}] {f.name}", f"    published: {f.published}",
                  f"    model:     {f.model}"] + ([f"    why:       {f.explanation}"] if f.explanation else [])
    lines += ["", "targets:"] + [f"  [{'ok' if t.ok else 'MISSED'}] {t.name}: {t.value:.4g} (target {t.threshold:g})"
                                 for t in v.targets]
    lines += ["", "global parameters (harness/model/params.py; memory_model.FRAGMENTATION_FRACTION):"]
    lines += [f"  {p['name']} = {p['value']:g} {p['unit']} [{p['kind']}: {p['source']}]" for p in v.params]
    lines += ["", f"outlier: {v.outlier_treatment}"]
    return "\n".join(lines)
