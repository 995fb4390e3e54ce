"""The performance model against measured training runs (`python -m harness model --against RUNS`):
for each training record, the step time the model predicts for that record's own configuration,
calibrated on OTHER records, beside the measured one. Never circular: the training records checked
are removed from every record list the calibration reads. Pure, except record_config (composes the
configuration from conf/).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..config.choices import RunKind
from ..config.schema import BenchConfig
from ..errors import HarnessError
from ..record import ResultRecord
from .calibration import calibrate
from .params import PARAMS, ModelParams
from .perfmodel import predict


@dataclass(frozen=True)
class StepTimeCheck:
    """One training run: the model's step time against the measured one."""
    run_id: str
    platform: str
    zero_stage: int
    micro_batch_size: int
    grad_acc_steps: int
    predicted_step_time_s: float
    measured_step_time_s: float
    """The record's step_time_s: the median of its throughput-mode steps after warm-up."""
    error_pct: float
    """(predicted - measured) / measured x 100: positive when the model is slower than the run."""
    compute_s: float
    exposed_comm_s: float
    measured_p10_s: Optional[float] = None
    measured_p90_s: Optional[float] = None
    load_avg_1m: Optional[float] = None
    """The machine's 1-minute load average when the run started (environment.machine.cpu), its own
    ranks included once they run: on a shared box, what else was competing."""
    efficiency_source: str = ""
    busbw_sources: tuple[str, ...] = ()
    out: Optional[str] = None
    """The record's out folder (config.out): tells apart runs of one name from several suites."""

    @property
    def label(self) -> str:
        return f"{Path(self.out).name}/{self.run_id}" if self.out else self.run_id

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(rec: ResultRecord) -> tuple:
    return rec.platform, rec.run_id, rec.created_utc


def record_config(rec: ResultRecord, compose: Callable[[list[str]], BenchConfig]) -> BenchConfig:
    """The configuration a training record ran: its stored command-line overrides composed again
    (out= dropped), checked against the resolved configuration it stores (split, stage, sequence)."""
    overrides = [o for o in rec.overrides if not o.split("=", 1)[0].lstrip("+~") == "out"]
    name = rec.run_id
    try:
        cfg = compose(overrides)
    except HarnessError as exc:
        raise HarnessError(f"record {name}: its overrides {overrides} no longer compose: {exc}") from None
    w, z = rec.config.get("workload") or {}, rec.config.get("zero") or {}
    got = {"platform": cfg.platform.name, "micro_batch_size": cfg.workload.micro_batch_size,
           "grad_acc_steps": cfg.workload.grad_acc_steps, "seq_len": cfg.workload.seq_len, "stage": cfg.zero.stage}
    want = {"platform": rec.platform, "micro_batch_size": w.get("micro_batch_size"),
            "grad_acc_steps": w.get("grad_acc_steps"), "seq_len": w.get("seq_len"), "stage": z.get("stage")}
    differ = [f"{k} {want[k]} (recomposed: {got[k]})" for k in got if want[k] != got[k]]
    if differ or cfg.kind != RunKind.training:
        raise HarnessError(f"record {name}: its overrides {overrides} do not give back the configuration it ran: "
                           + ", ".join(differ or [f"kind {cfg.kind.value}"]))
    return cfg


def checkable(records: list[ResultRecord]) -> list[ResultRecord]:
    """The ok training records that state a measured step time."""
    return [r for r in records if r.kind == "training" and r.status == "ok"
            and (r.metrics.get("step_time_s") or {}).get("value")]


def check_step_times(runs: list[tuple[ResultRecord, BenchConfig]], records: list[ResultRecord],
                     compute_records: Optional[list[ResultRecord]] = None, references: Optional[list] = None,
                     params: ModelParams = PARAMS) -> list[StepTimeCheck]:
    """(training record, its configuration) -> the model's step time against the measured one.
    Calibrated as `python -m harness model` does (harness.model.calibration.calibrate): busbw curves from
    the collective records of the run's platform among `records`; the efficiency from
    `compute_records` when given (another platform of the same machine allowed), else from the
    training records among `records`, else from `references`. The checked records themselves never
    calibrate anything."""
    checked = {_key(rec) for rec, _ in runs}
    pool = [r for r in records if _key(r) not in checked]
    compute = None if compute_records is None else [r for r in compute_records if _key(r) not in checked]
    out = []
    for rec, cfg in runs:
        step = rec.metrics.get("step_time_s") or {}
        measured = step.get("value")
        if not measured:
            raise HarnessError(f"record {rec.run_id}: no measured step_time_s (status {rec.status})")
        pred = predict(cfg, calibrate(pool, cfg, references, params, compute_records=compute), params=params)
        load = ((rec.environment.get("machine") or {}).get("cpu") or {}).get("load_avg_1_5_15")
        out.append(StepTimeCheck(
            run_id=rec.run_id, platform=cfg.platform.name, zero_stage=cfg.zero.stage,
            micro_batch_size=cfg.workload.micro_batch_size, grad_acc_steps=cfg.workload.grad_acc_steps,
            predicted_step_time_s=pred.step_time_s, measured_step_time_s=float(measured),
            error_pct=(pred.step_time_s - measured) / measured * 100, compute_s=pred.compute_s,
            exposed_comm_s=pred.exposed_comm_s, measured_p10_s=step.get("p10"), measured_p90_s=step.get("p90"),
            load_avg_1m=load[0] if load else None, efficiency_source=pred.efficiency_source,
            busbw_sources=tuple(sorted({c.source for c in pred.comm})), out=rec.config.get("out")))
    return out
