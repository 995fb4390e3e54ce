"""What a tune leaves: report.md (each step's table, prediction beside measurement, loss parity,
each step's contribution, and the confirmation: the winner re-measured against the default,
interleaved, its gain with a 95% interval and the verdict), and the configuration kept (the winner
on a significant gain, else the default) as a suite preset for `make bench` and a DeepSpeed JSON."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

import yaml

from ..atomic import write_bytes_atomic
from ..config.schema import CONF_DIR
from ..plan import deepspeed_config, safe_name
from .confirm import DEFAULT, WINNER, counts
from .trials import Trial, repo_relative


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _pred_cells(t: Trial) -> list[str]:
    p = t.prediction or {}
    if "memory" not in p:
        return ["-", "-", "-"]
    mem = p["memory"]
    fits = "fits" if mem["fits"] else "OOM"
    return [f"{mem['total_gib']:.2f} ({fits})", _fmt(p.get("step_time_s")), _fmt(p.get("samples_per_s"))]


def _error_pct(t: Trial) -> str:
    p = t.prediction or {}
    if t.value is None or not p.get("samples_per_s") or t.step == 1:
        return "-"
    return f"{100 * (p['samples_per_s'] - t.value) / t.value:+.0f}%"


def _parity(t: Trial) -> str:
    p = t.parity
    if not p or p.get("ok") is None:
        return "-"
    return f"{'ok' if p['ok'] else 'FAIL'} {p['max_rel_diff']:.1e}"


def step_table(step, best: Optional[Trial]) -> list[str]:
    unit = "all-reduce busbw GB/s" if step.step == 1 else "samples/s"
    lines = [f"| trial | role | status | measured {unit} | predicted mem GiB | predicted step s "
             f"| predicted samples/s | model error | loss parity | record |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = ([step.start] if step.start is not None and step.start not in step.trials else []) + step.trials
    for t in rows:
        mark = " **best**" if best is not None and t is best else ""
        status = t.status + (" (reused)" if t.reused else "")
        if t.status not in ("ok",) and t.reason:
            status += f": {t.reason}"
        role = "start" if t is step.start and t not in step.trials else t.role
        lines.append(f"| {t.label}{mark} | {role} | {status} | {_fmt(t.value, 4)} | " + " | ".join(_pred_cells(t))
                     + f" | {_error_pct(t)} | {_parity(t)} | {t.records[0] if t.records else '-'} |")
    return lines


def contributions(tuner) -> list[tuple[str, float, float]]:
    """(what, samples/s before, after) per training step, from the default configuration on."""
    out = []
    before = tuner.baseline.value
    for s in tuner.steps:
        if s.step == 1 or s.best is None or s.best.value is None:
            continue
        start = s.start.value if s.start is not None and s.start.value is not None else before
        if s.step == 2 and s.start is not tuner.baseline and s.start is not None and s.start.value is not None:
            out.append(("step 1 (NCCL variables, on the default configuration)", before, s.start.value))
        out.append((f"step {s.step} ({s.title})", start, s.best.value))
        before = s.best.value
    return out


def _kept_lines(c, best: Trial) -> list[str]:
    """The summary's lines on the configuration kept and the confirmation that decided it."""
    if c.keeps_winner:
        return [f"- Kept: `{best.label}`: **{c.judgement.text()}**, confirmed over {c.repeats} interleaved pairs "
                f"(its one search trial: {_fmt(c.search_value, 4)} samples/s)"]
    return [f"- Kept: **the default configuration**: {c.judgement.text()}"
            + (f" (the search's best, `{c.winner}`, measured {_fmt(c.search_value, 4)} samples/s in one trial)"
               if c.folder else "")]


def confirmation_section(c) -> list[str]:
    """The winner against the default, re-measured interleaved: both sides' samples and the verdict."""
    lines = ["", "## Confirmation: the winner against the default, interleaved", ""]
    if c.folder is None:
        return lines + [c.judgement.text()[0].upper() + c.judgement.text()[1:] + "."]
    lines += [f"{c.repeats} pairs run in the order default, winner, default, winner, ... (records under "
              f"`{c.folder}/`); the gain is the ratio of the medians with its 95% bootstrap interval "
              "(harness/verdict/compare.py); the winner is kept only when the whole interval lies above 1x.", "",
              "| side | samples/s, in launch order | median |", "|---|---|---|"]
    for side, name in ((DEFAULT, "default"), (WINNER, f"winner `{c.winner}`")):
        values = c.samples(side)
        shown = ", ".join(f"{t.value:.4g}" if counts(t) else (t.status if t.status != "ok" else "parity FAIL")
                          for t in c.trials if t.role == f"confirm-{side}")
        lines.append(f"| {name} | {shown or '-'} | {_fmt(statistics.median(values), 4) if values else '-'} |")
    figure = c.judgement.figure()
    lines += ["", f"**Verdict: {c.judgement.verdict}**{': ' + figure if figure else ''}; "
                  f"kept: the {'winner' if c.keeps_winner else 'default configuration'}."]
    return lines


def report(tuner, best: Trial, preset: Path, ds_json: Path) -> str:
    cfg = tuner.cfg
    lines = [f"# Tune: {cfg.workload.name} on {cfg.platform.name}", "",
             f"- Steps {tuner.tune.steps}; strategy `{tuner.tune.strategy.value}`; every trial is a record "
             f"under `step<N>/`; overrides of every trial: {' '.join(tuner.base) or '(none)'}",
             f"- Default configuration: ZeRO-{cfg.zero.stage}, micro-batch {cfg.workload.micro_batch_size} x "
             f"grad-acc {cfg.workload.grad_acc_steps} (C = {cfg.workload.samples_per_step}): "
             f"**{_fmt(tuner.baseline.value, 4)} samples/s**",
             *_kept_lines(tuner.confirmation, best),
             f"- Kept overrides: `{' '.join(best.overrides)}`",
             f"- Preset: `{repo_relative(preset)}` (`make bench PLATFORM={cfg.platform.name} "
             f"ARGS=\"suite={preset.stem}\"`); DeepSpeed JSON: `{repo_relative(ds_json)}`", "",
             "## What each step contributed", "",
             "The search's single measurements (one sample each; the confirmation below re-measures the winner).", "",
             "| step | samples/s before | after | gain |", "|---|---|---|---|"]
    for what, a, b in contributions(tuner):
        lines.append(f"| {what} | {a:.4g} | {b:.4g} | {b / a:.3f}x |")
    lines += confirmation_section(tuner.confirmation)
    lines += ["", f"## Loss parity (tolerance {tuner.tolerance:g} relative, same seed and data, first steps)", ""]
    bp = best.parity
    if best is tuner.baseline:
        lines.append("The configuration kept is the default one.")
    elif bp and bp.get("ok") is not None:
        lines.append(f"Best vs default: {'PASS' if bp['ok'] else 'FAIL'}: largest relative loss difference "
                     f"{bp['max_rel_diff']:.2e} over the first {bp['num_steps']} steps (tolerance {bp['tolerance']:g}).")
    failed = [t for s in tuner.steps for t in s.trials if t.parity and t.parity.get("ok") is False]
    lines.append(f"Trials that failed parity (never chosen): {', '.join(t.label for t in failed) or 'none'}.")
    for s in tuner.steps:
        head = (f"Strategy {s.strategy}, budget {s.budget} trials; space {s.space_size} configurations, "
                f"{s.excluded} skipped as predicted out of memory." if s.space_size else "")
        lines += ["", f"## Step {s.step}: {s.title}", "", " ".join(x for x in (head, s.note and s.note[0].upper() + s.note[1:] + ".") if x), ""]
        lines += step_table(s, s.best)
    model_note = ("Predictions come from `python -m harness model` (harness/model/perfmodel.py), calibrated on the "
                  "records measured so far in this tune (computation efficiency from the default configuration "
                  "and later trials; busbw curves from step 1's sweep); each was made before its trial ran.")
    lines += ["", "## About the predictions", "", model_note, ""]
    return "\n".join(lines)


def write_outputs(tuner, best: Trial, install: bool) -> dict[str, Path]:
    cfg = tuner.cfg
    name = f"tuned-{safe_name(cfg.platform.name)}-{safe_name(cfg.workload.name)}"
    best_dir = tuner.out / "best"
    best_dir.mkdir(parents=True, exist_ok=True)
    run_overrides = [o for o in best.overrides if not o.startswith(("platform=",))]
    default_overrides = [o for o in tuner.base if not o.startswith(("platform=",))]
    c = tuner.confirmation
    runs = [{"name": "default", "overrides": default_overrides}]
    if c.keeps_winner:
        runs.append({"name": "tuned", "overrides": run_overrides})
    suite = {"defaults": ["suite_schema"], "name": name,
             "description": f"tuned by `python -m harness tune` on {cfg.platform.name}: {c.judgement.text()}",
             "runs": runs}
    kept = (f"the best of {sum(len(s.trials) for s in tuner.steps)} trials, confirmed against the default"
            if c.keeps_winner else f"the default configuration ({c.judgement.verdict})")
    text = (f"# Generated by `python -m harness tune` ({tuner.out.name}); {kept}."
            f"\n# Run: make bench PLATFORM={cfg.platform.name} ARGS=\"suite={name}\"\n"
            + yaml.safe_dump(suite, sort_keys=False))
    paths = {"preset": best_dir / f"{name}.yaml"}
    write_bytes_atomic(paths["preset"], text.encode())
    if install:
        paths["installed"] = CONF_DIR / "suite" / f"{name}.yaml"
        write_bytes_atomic(paths["installed"], text.encode())
    best_cfg = tuner.runner.compose(best.overrides)
    ds = deepspeed_config(best_cfg)
    paths["deepspeed"] = best_dir / "deepspeed.json"
    write_bytes_atomic(paths["deepspeed"], (json.dumps(ds, indent=2) + "\n").encode())
    extras: dict[str, Any] = {"nccl_env": {**best_cfg.platform.nccl_env, **best_cfg.nccl_env},
                              "gradient_collective": best_cfg.zero.gradient_collective.value,
                              "note": "not DeepSpeed JSON keys: export nccl_env in the ranks' environment; "
                                      "gradient_collective=reduce_scatter is the suite's run-time replacement of "
                                      "DeepSpeed's ZeRO-1/2 gradient all-reduce (benchmarks/reduce_scatter/install.py)"}
    paths["extras"] = best_dir / "environment.json"
    write_bytes_atomic(paths["extras"], (json.dumps(extras, indent=2) + "\n").encode())
    paths["report"] = tuner.out / "report.md"
    write_bytes_atomic(paths["report"], report(tuner, best, paths.get("installed", paths["preset"]),
                                               paths["deepspeed"]).encode())
    return paths
