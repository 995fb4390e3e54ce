"""The three-step tuning method: `make tune PLATFORM=<p> WORKLOAD=<w> [OUT=<dir>]`.

    python -m harness tune platform=<p> workload=<w> [tune.strategy=grid|bayes|auto]
                           [tune.budget=N] [tune.steps=[1,2,3]] [out=DIR] [other overrides]

1. NCCL variables (tune.nccl_space) on a standalone all-reduce swept over the message sizes the
   workload's gradient buckets produce; the best average busbw wins. The default environment's
   sweep (all-reduce, all-gather, reduce-scatter) also gives the performance model its curves.
2. (micro_batch_size, grad_acc_steps) with C fixed x ZeRO stage, with step 1's NCCL variables.
3. overlap_comm, the gradient collective (DeepSpeed's all-reduce or the suite's reduce-scatter),
   bucket sizes, contiguous_gradients, on step 2's best.
Each step runs its space exhaustively (grid) or by Bayesian search (Optuna TPE) within a budget;
the performance model (harness/model/perfmodel.py) orders the trials and skips those it predicts to run
out of memory. Every trial is an ordinary run record under OUT/step<N>/; the default configuration
is measured first, and its losses are the reference of the loss-parity check every trial gets.
Running the same command with the same OUT resumes: finished trials are reused, not rerun.
Then the winner and the default are re-measured, interleaved (harness/tune/confirm.py): the winner
is kept only when the 95% interval of its gain lies above zero, else the default is.
Outputs in OUT: tune.json (every trial, the confirmation), report.md, best/ (suite preset and
DeepSpeed JSON of the configuration kept).

Under Slurm (platform.launcher=slurm) trials that do not depend on each other's results are
launched together as one job array, so a step waits in the queue once rather than once a trial:
the default configuration alone first (every later step needs it); then per step, its fixed trial
(step 1's default-environment sweep, step 2's default+NCCL run) with the search's first batch. A
grid step's batch is its whole budget (one array). A Bayesian step has two: the model's best
predictions (half the budget, the anchor among them, predicted once rather than after each trial)
and then the rest of the budget as TPE proposals asked at once (constant liar). Locally trials run
one at a time as before, the model re-predicting after each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..config.choices import Device, LauncherKind, SearchStrategy
from ..config.compose import compose
from ..config.schema import BenchConfig, to_dict
from ..errors import HarnessError
from ..model.calibration import calibrate
from ..model.perfmodel import predict
from ..record import ResultRecord, write_json_atomic
from ..verdict.cross_machine import this_machine
from ..verdict.references import load_references
from . import parity, search, space
from .confirm import Confirmation, confirm
from .outcome import (STATE_FILE, allreduce_busbw, by_prediction, parity_text, pick_record, pred_text, predicted_oom,
                      samples_per_s)
from .space import Candidate
from .trials import Trial, TrialRunner, TrialSpec, trial_key


@dataclass
class StepResult:
    step: int
    title: str
    strategy: str = "-"
    budget: int = 0
    space_size: int = 0
    excluded: int = 0
    trials: list[Trial] = field(default_factory=list)
    best: Optional[Trial] = None
    start: Optional[Trial] = None
    """The configuration the step started from (its value is what the step improves on)."""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "title": self.title, "strategy": self.strategy, "budget": self.budget,
                "space_size": self.space_size, "excluded_predicted_oom": self.excluded, "note": self.note,
                "trials": [t.to_dict() for t in self.trials],
                "best": self.best.label if self.best else None,
                "start": self.start.label if self.start else None}


WARM_CACHE = "measure.compile_cache=warm"
"""Added to every trial of a tune that compiles, unless measure.compile_cache is given: a trial of a graph
compiled before (a step-3 knob of a compiled winner, a confirmation repeat) loads it from Inductor's caches
instead of compiling cold again. The search ranks steady-state samples/s, which the warm-up keeps free of
compile time either way. Measured on 2 cores, a compiled llama-tiny tune's step 3 (4 runs): 74 s, 166 s cold."""


class Tuner:
    def __init__(self, overrides: list[str], out: Path, cfg: Optional[BenchConfig] = None):
        self.cfg = cfg or compose(overrides)
        self.tune = self.cfg.tune
        # tune.* only steer the search: they are not part of any trial (a resumed tune may change them)
        self.base = [o for o in overrides if not o.lstrip("+~").startswith(("tune.", "out=", "history="))]
        if self.compiles() and not any(o.lstrip("+~").startswith("measure.compile_cache") for o in self.base):
            self.base.append(WARM_CACHE)
        self.out = out
        self.runner = TrialRunner(out)
        self.steps: list[StepResult] = []
        self.baseline: Optional[Trial] = None
        self.baseline_record: Optional[ResultRecord] = None
        """The default configuration's record: every training trial's losses are checked against it."""
        self.tolerance = self.tune.loss_tolerance or parity.default_tolerance(self.cfg.workload.precision)
        self.calibration_records: list[ResultRecord] = []
        self.references: Optional[list] = None
        self.machine: Optional[str] = None   # this_machine's, once read ("" where none)
        self.confirmation: Optional[Confirmation] = None
        """The winner re-measured against the default, interleaved: what decides the configuration kept."""

    def compiles(self) -> bool:
        """Whether any trial compiles: the workload does, or step 2 tries a compiled stack."""
        return self.cfg.workload.compile.value != "none" or any(c.value != "none" for c in self.tune.compile)

    # ---- running and judging trials ----------------------------------------------------------
    @property
    def batched(self) -> bool:
        """Under Slurm, trials that do not wait for each other's results are launched together."""
        return self.cfg.platform.launcher == LauncherKind.slurm

    def trial(self, step: int, label: str, params: dict[str, Any], overrides: list[str], *,
              role: str = "search", prediction: Optional[dict[str, Any]] = None) -> Trial:
        return self.run_trials([TrialSpec(step, label, params, overrides, role, prediction)])[0]

    def run_trials(self, specs: list[TrialSpec]) -> list[Trial]:
        """Each trial (all of one step) judged: reused when its record is there, the others launched
        together (under Slurm one job array)."""
        step = specs[0].step
        existing = self.runner.existing(step)
        done = {i: existing.get(trial_key(sp.overrides)) for i, sp in enumerate(specs)}
        fresh = [i for i, d in done.items() if not d]
        for i in fresh:
            sp = specs[i]
            print(f"\n[tune step {step}] {sp.label}" + (f" ({sp.role})" if sp.role != "search" else "")
                  + (f": predicted {pred_text(sp.prediction)}" if sp.prediction else ""), flush=True)
        if len(fresh) > 1:
            print(f"[tune step {step}] {len(fresh)} trials launched together"
                  + (" (one Slurm job array)" if self.batched else ""), flush=True)
        if fresh:
            done.update(zip(fresh, self.runner.run_many(step, [(specs[i].label, specs[i].overrides) for i in fresh])))
        return [self.judge(sp, done[i], reused=i not in fresh) for i, sp in enumerate(specs)]

    def judge(self, sp: TrialSpec, done: list[tuple[str, ResultRecord]], reused: bool) -> Trial:
        main = pick_record(done)
        rec = main[1]
        value_of = samples_per_s if rec.kind == "training" else allreduce_busbw
        t = Trial(step=sp.step, label=sp.label, params=sp.params, overrides=sp.overrides, status=rec.status,
                  value=value_of(rec), unit="GB/s" if sp.step == 1 else "samples/s", reason=rec.reason,
                  records=[p for p, _ in done], reused=reused, role=sp.role, prediction=sp.prediction,
                  wall_s=float(rec.wall_s))
        if rec.kind == "training":
            self.calibration_records.append(rec)
            if sp.role == "default":  # the reference of every other training trial's losses
                self.baseline_record = rec
            elif self.baseline_record is not None and self.baseline_record.status == "ok":
                t.parity = parity.check(rec, self.baseline_record, self.tolerance).to_dict()
        else:
            self.calibration_records.extend(r for _, r in done)
        verb = "reused" if reused else "measured"
        shown = f"{t.value:.3f} {t.unit}" if t.value is not None else f"{t.status}: {t.reason}"
        print(f"  [tune {'step ' if isinstance(sp.step, int) else ''}{sp.step}] {sp.label}: {verb} {shown}"
              + (f"; loss parity {parity_text(t.parity)}" if t.parity else ""), flush=True)
        return t

    def eligible(self, t: Trial) -> bool:
        """A trial can be the best when it ran, and (for training) trains like the default."""
        return t.status == "ok" and t.value is not None and (t.parity is None or t.parity.get("ok") is not False)

    def best_of(self, trials: list[Trial]) -> Optional[Trial]:
        ok = [t for t in trials if self.eligible(t)]
        return max(ok, key=lambda t: t.value) if ok else None

    def save(self) -> None:
        state = {"platform": self.cfg.platform.name, "workload": self.cfg.workload.name,
                 "overrides": self.base, "tune": to_dict(self.tune), "loss_tolerance": self.tolerance,
                 "updated_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "baseline": self.baseline.to_dict() if self.baseline else None,
                 "steps": [s.to_dict() for s in self.steps],
                 "confirmation": self.confirmation.to_dict() if self.confirmation else None}
        write_json_atomic(self.out / STATE_FILE, state)

    # ---- predictions -------------------------------------------------------------------------
    def predictions(self, overrides_of: list[list[str]]) -> list[Optional[dict[str, Any]]]:
        """The model's predictions, calibrated on every record this tune has so far (before the
        first training record: on the reference table's figures of the workload, if any)."""
        if self.references is None:
            self.references = load_references()
        out = []
        for ov in overrides_of:
            try:
                cfg = self.runner.compose(ov)  # calibrated for its own stage: ZeRO-3 computes slower
                if self.machine is None:       # the table's entries of this machine, where it holds several
                    p = cfg.platform
                    self.machine = this_machine(p.name, p.device.value, p.launcher.value) or ""
                cal = calibrate(self.calibration_records, cfg, self.references, machine=self.machine or None)
                out.append(predict(cfg, cal).to_dict())
            except HarnessError as exc:  # an invalid combination: the run will say so too
                out.append({"error": str(exc)})
        return out

    def search_step(self, result: StepResult, candidates: list[Candidate], base: list[str],
                    known: dict[str, Trial | TrialSpec], model: bool = True, anchor=None,
                    lead: Optional[list[TrialSpec]] = None) -> list[Trial]:
        """Predict, exclude predicted OOM, order, then search within the budget. `known` maps a
        candidate key to a trial measured elsewhere (the start point), or to one of `lead`: trials the
        step runs whatever the search does, with its first batch (under Slurm: in its first job
        array; locally: first, before the predictions). Returns the lead's trials, which go first in
        result.trials. model=False (step 1: collective sweeps, which the training model does not
        describe): no prediction, no skipping, the space's own order."""
        lead = list(lead or [])
        lead_at, lead_trials = len(result.trials), []
        if lead and not self.batched:
            lead_trials = self.run_trials(lead)
            result.trials.extend(lead_trials)
            known = {k: _measured(v, lead, lead_trials) for k, v in known.items()}
            lead = []
            self.save()
        preds = (self.predictions([base + list(c.overrides) for c in candidates]) if model
                 else [None] * len(candidates))
        pred_of = {c.key: p for c, p in zip(candidates, preds)}
        fits = [c for c in candidates if not (self.tune.skip_predicted_oom and predicted_oom(pred_of[c.key]))]
        excluded = [c for c in candidates if c not in fits]
        result.space_size, result.excluded = len(candidates), len(excluded)
        for c in excluded:
            p = pred_of[c.key]
            result.trials.append(Trial(step=result.step, label=c.label(), params=c.as_dict(),
                                       overrides=base + list(c.overrides), status="skipped", prediction=p,
                                       reason=f"predicted out of memory: {p['memory']['total_gib']:.1f} GiB "
                                              f"> {p['memory']['capacity_gib']:.1f} GiB"))
        if not fits:
            result.note = "every configuration is predicted to run out of memory"
            strategy, budget = None, 0  # the lead still runs
        else:
            strategy, budget = search.choose(self.tune, len(fits))
            result.strategy, result.budget = strategy.value, budget
        ordered = by_prediction(fits, pred_of)
        first = anchor([c for c in fits if c.key not in known]) if anchor is not None and fits else None
        if first is not None:  # measured first: it calibrates the model where it knows least
            ordered = [first] + [c for c in ordered if c is not first]
        engine = search.make(strategy, fits, excluded, ordered, self.tune.seed) if fits else None
        # Bayes: the first half of the budget goes to the model's best prediction at that moment
        # (re-predicted after every trial, or once per batch under Slurm), the rest to TPE
        model_first = max(2, budget // 2) if fits and strategy == SearchStrategy.bayes and model else 0
        seen: set[str] = set()
        used = 0
        for c in fits:  # the start point is part of the space: it counts, it is not rerun
            if c.key in known:
                t = known[c.key]
                if isinstance(t, Trial):
                    engine.observe(c, t.score)
                else:  # measured with the first batch
                    engine.reserve(c)
                seen.add(c.key)
                used += 1
        existing = self.runner.existing(result.step)
        for c in fits:  # trials an interrupted tune finished: reused first, and they count
            if used < budget and c.key not in known and trial_key(base + list(c.overrides)) in existing:
                t = self.trial(result.step, c.label(), c.as_dict(), base + list(c.overrides),
                               prediction=pred_of[c.key])
                result.trials.append(t)
                engine.observe(c, t.score)
                seen.add(c.key)
                used += 1
                self.save()
        while used < budget or lead:
            room = budget - used if self.batched else min(1, budget - used)
            picks: list[Candidate] = []
            if room and model_first > 0:
                n = min(room, model_first)
                model_first -= n
                if first is not None and first.key not in seen:
                    picks.append(first)
                left = [c for c in fits if c.key not in seen and c not in picks]
                if len(picks) < n and left:
                    fresh = self.predictions([base + list(x.overrides) for x in left])
                    pred_of.update({x.key: p for x, p in zip(left, fresh)})
                    picks += by_prediction(left, pred_of)[:n - len(picks)]
            elif room:
                while len(picks) < room and (c := engine.propose()) is not None:
                    picks.append(c)
            if not picks and not lead:
                break
            specs = lead + [TrialSpec(result.step, c.label(), c.as_dict(), base + list(c.overrides),
                                      prediction=pred_of[c.key]) for c in picks]
            trials = self.run_trials(specs)
            if lead:
                lead_trials = trials[:len(lead)]
                result.trials[lead_at:lead_at] = lead_trials
                for c in fits:  # known points that a lead trial measured
                    if isinstance(known.get(c.key), TrialSpec):
                        engine.observe(c, _measured(known[c.key], lead, lead_trials).score)
                lead = []
            for c, t in zip(picks, trials[len(trials) - len(picks):]):
                result.trials.append(t)
                engine.observe(c, t.score)
                seen.add(c.key)
                used += 1
            self.save()
        return lead_trials

    # ---- the three steps ---------------------------------------------------------------------
    def step1(self) -> list[str]:
        """NCCL variables. Returns the overrides of the best environment (empty: the default)."""
        result = StepResult(1, "NCCL variables on a standalone all-reduce")
        self.steps.append(result)
        if self.cfg.platform.world_size < 2:
            result.note = "one rank: there is no collective to tune"
            return []
        lo, hi = space.allreduce_sizes(self.cfg)
        sweep = [*self.base, "kind=collective", f"collective.min_bytes={lo}", f"collective.max_bytes={hi}",
                 "collective.step_factor=2", f"collective.iters={self.tune.collective_iters}",
                 f"collective.warmup_iters={max(1, self.tune.collective_iters // 4)}", "collective.check=false",
                 f"collective.dtype={'float32' if self.cfg.workload.precision.value == 'fp32' else 'bfloat16'}"]
        spec = TrialSpec(1, "default-env", {}, sweep + ["collective.ops=[all_reduce,all_gather,reduce_scatter]"],
                         role="default")
        if self.cfg.platform.device == Device.cpu:
            default = self.run_trials([spec])[0]
            result.trials.append(default)
            result.start = result.best = default
            result.note = ("the cpu platform's ranks talk over gloo, which no NCCL variable affects: step 1 "
                           "measured the collectives' curves for the performance model and tried nothing")
            return []
        candidates = space.nccl_candidates(self.cfg)
        default = self.search_step(result, candidates, sweep + ["collective.ops=[all_reduce]"], {}, model=False,
                                   lead=[spec])[0]
        result.start = default
        result.best = self.best_of(result.trials) or default
        if result.best is default:
            return []
        return [o for o in result.best.overrides if o.startswith("+nccl_env.")]

    def step2(self, nccl: list[str]) -> Trial:
        result = StepResult(2, "micro-batch x gradient accumulation (C fixed) x ZeRO stage"
                            + (" x activation checkpointing" if self.tune.checkpointing else "")
                            + (" x compile" if self.tune.compile else "") + (" x kernels" if self.tune.kernels else ""))
        self.steps.append(result)
        base = [*self.base, *nccl]
        # with step 1's NCCL variables the default configuration is measured again, with the search
        lead = [TrialSpec(2, "default+nccl", {}, base, role="default+nccl")] if nccl else []
        w = self.cfg.workload
        here = ("stage", self.cfg.zero.stage), ("micro_batch_size", w.micro_batch_size), ("grad_acc_steps", w.grad_acc_steps)
        if self.tune.checkpointing:
            here += (("checkpointing", space.checkpointing_here(self.cfg).word),)
        here += space.stack_here(self.cfg)
        candidates = space.batch_candidates(self.cfg)
        known = {c.key: lead[0] if lead else self.baseline for c in candidates if c.params == here}
        measured = self.search_step(result, candidates, base, known, anchor=self.anchor_micro_batch, lead=lead)
        refused = space.refused_stacks(self.cfg)
        if refused:   # the platform refuses them: left out of the space, not failed trials
            result.note = "; ".join(filter(None, [result.note, "left out (refused on this platform): " + "; ".join(refused)]))
        start = measured[0] if lead else self.baseline
        result.start = start
        result.best = self.best_of(result.trials + [start]) or start
        return result.best

    def anchor_micro_batch(self, fits: list[Candidate]) -> Optional[Candidate]:
        """Step 2's first trial: the default stage at the largest micro-batch predicted to fit. The
        computation efficiency is measured only at the default micro-batch so far, and the model
        holds it flat beyond the measured sizes; one measurement at the other end of the range
        lets it interpolate (log micro-batch) between the two for every other split."""
        own = space.checkpointing_here(self.cfg).word   # with tune.checkpointing, the workload's own first
        stack = dict(space.stack_here(self.cfg))        # with tune.compile / tune.kernels, the workload's own stack
        same = [c for c in fits if c.as_dict()["stage"] == self.cfg.zero.stage]
        return max(same, key=lambda c: (c.as_dict()["micro_batch_size"], c.as_dict().get("checkpointing") == own,
                                        all(c.as_dict().get(k) == v for k, v in stack.items())),
                   default=None)

    def step3(self, start: Trial, start_overrides: list[str]) -> Trial:
        result = StepResult(3, "DeepSpeed communication knobs")
        self.steps.append(result)
        result.start = start
        stage = self.runner.compose(start_overrides).zero.stage
        candidates = space.comm_candidates(self.cfg, stage)
        if not candidates:
            result.note = f"ZeRO stage {stage} has no communication knobs to tune"
            result.best = start
            return start
        self.search_step(result, candidates, start_overrides, {})
        result.best = self.best_of(result.trials + [start]) or start
        return result.best

    def run(self) -> Trial:
        print(f"tune {self.cfg.platform.name} / {self.cfg.workload.name}: steps {self.tune.steps}, "
              f"strategy {self.tune.strategy.value} -> {self.out}\n"
              f"(interrupted? the same command with out={self.out} resumes it)", flush=True)
        self.baseline = self.trial(2, "default", {}, list(self.base), role="default",
                                   prediction=self.predictions([list(self.base)])[0])
        self.save()
        if self.baseline.status != "ok":
            raise HarnessError(f"the default configuration did not run ({self.baseline.status}: "
                               f"{self.baseline.reason}); fix it before tuning (see {self.baseline.records[0]})")
        nccl = self.step1() if 1 in self.tune.steps else []
        self.save()
        best, best_overrides = self.baseline, [*self.base, *nccl]
        if 2 in self.tune.steps:
            best = self.step2(nccl)
            best_overrides = best.overrides
            self.save()
        if 3 in self.tune.steps:
            best = self.step3(best, best_overrides)
            self.save()
        self.confirmation = confirm(self, best)  # the kept configuration: the winner only on a significant gain
        self.save()
        return best if self.confirmation.keeps_winner else self.baseline


def _measured(t: Trial | TrialSpec, specs: list[TrialSpec], trials: list[Trial]) -> Trial | TrialSpec:
    """The trial that measured `t`, when `t` is one of these specs (the same object)."""
    return next((done for sp, done in zip(specs, trials) if sp is t), t)
