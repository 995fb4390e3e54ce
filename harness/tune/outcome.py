"""What the tuner reads of a trial: the record it is judged on and its figures, the model's prediction
and the loss-parity check as text; and its output folder (the default one, and whether OUT may be
resumed)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from ..config.schema import REPO_ROOT, BenchConfig
from ..errors import HarnessError
from ..plan import safe_name
from ..record import ResultRecord
from .space import Candidate

STATE_FILE = "tune.json"


def by_prediction(cands: list[Candidate], pred_of: dict[str, Optional[dict[str, Any]]]) -> list[Candidate]:
    """Best predicted throughput first (candidates without a prediction keep their order, last)."""
    return sorted(cands, key=lambda c: -((pred_of.get(c.key) or {}).get("samples_per_s") or 0.0))


def pick_record(done: list[tuple[str, ResultRecord]]) -> tuple[str, ResultRecord]:
    """The record a trial is judged on: the all-reduce of a collective sweep, else the only one."""
    for path, rec in done:
        if rec.benchmark == "all_reduce":
            return path, rec
    return done[0]


def samples_per_s(rec: ResultRecord) -> Optional[float]:
    m = rec.metrics.get("samples_per_s")
    return m["value"] if rec.status == "ok" and m else None


def allreduce_busbw(rec: ResultRecord) -> Optional[float]:
    m = rec.metrics.get("avg_busbw_gbps")
    return m["value"] if rec.status == "ok" and m else None


def predicted_oom(pred: Optional[dict[str, Any]]) -> bool:
    return bool(pred) and "memory" in pred and not pred["memory"]["fits"]


def pred_text(p: Optional[dict[str, Any]]) -> str:
    if not p or "memory" not in p:
        return "n/a"
    return f"{p['samples_per_s']:.3g} samples/s, {p['memory']['total_gib']:.2f} GiB"


def parity_text(p: Optional[dict[str, Any]]) -> str:
    if not p or p.get("ok") is None:
        return "n/a"
    return f"{'ok' if p['ok'] else 'FAIL'} (max rel. diff {p['max_rel_diff']:.1e} over {p['num_steps']} steps)"


def default_out(cfg: BenchConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return REPO_ROOT / "results" / f"tune-{safe_name(cfg.platform.name)}-{safe_name(cfg.workload.name)}-{stamp}"


def check_resume(out: Path, cfg: BenchConfig, base: list[str]) -> None:
    """OUT may hold only a tune of the same platform, workload and (non-tune) overrides."""
    path = out / STATE_FILE
    if not path.exists():
        if out.exists() and any(out.iterdir()):
            raise HarnessError(f"out={out} is not empty and holds no {STATE_FILE}: choose a new out= (a tune "
                               "writes its own folder)")
        return
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"{path} is unreadable ({exc}); choose a new out=") from None
    mine = {"platform": cfg.platform.name, "workload": cfg.workload.name, "overrides": base}
    theirs = {k: state.get(k) for k in mine}
    if theirs != mine:
        raise HarnessError(f"out={out} holds a different tune ({theirs}); this one is {mine}. Resume it with "
                           "the same arguments, or choose a new out=")
    print(f"resuming the tune in {out}: finished trials are reused", flush=True)
