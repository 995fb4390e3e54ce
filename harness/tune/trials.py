"""Trials as ordinary runs: each trial is planned, launched and recorded exactly like a `bench`
run, in OUT/step<N>/ (records beside runs/); trials launched together are launched like a `bench -m`
sweep (under Slurm: one job array). A tune that is started again with the same OUT reuses
every trial whose record is there (matched on the trial's overrides) and starts afresh any run an
interruption left without a record."""
from __future__ import annotations

import copy
import shutil
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from ..bench import checked_images, execute, plan_runs
from ..config.compose import compose
from ..config.schema import REPO_ROOT, BenchConfig
from ..errors import HarnessError
from ..record import ResultRecord
from ..verdict.record_files import Loaded, load_records


@lru_cache(maxsize=512)
def _compose(overrides: tuple[str, ...]) -> BenchConfig:
    return compose(list(overrides))


def trial_key(overrides: list[str]) -> tuple[str, ...]:
    return tuple(sorted(overrides))


@dataclass
class Trial:
    """One point of a step's search, run (or reused, or skipped) and judged."""
    step: int | str
    """1, 2 or 3; "confirm" for the re-measurements that confirm the winner (harness/tune/confirm.py)."""
    label: str
    params: dict[str, Any]
    overrides: list[str]
    status: str
    """ok | oom | error | timeout (the record's), or skipped (predicted out of memory, not run)."""
    value: Optional[float] = None
    """samples/s for steps 2 and 3, the all-reduce's average busbw (GB/s) for step 1; None if not ok."""
    unit: str = "samples/s"
    reason: Optional[str] = None
    records: list[str] = field(default_factory=list)
    """Record files, relative to the tune's OUT."""
    reused: bool = False
    """Taken from an earlier (interrupted) tune's record rather than run now."""
    role: str = "search"
    """search | default (the workload's default configuration) | default+nccl | start (the previous step's best)
    | confirm-default, confirm-winner (the confirmation's interleaved re-measurements)."""
    prediction: Optional[dict[str, Any]] = None
    """The performance model's prediction made before the trial ran (perfmodel.Prediction.to_dict())."""
    parity: Optional[dict[str, Any]] = None
    wall_s: float = 0.0

    @property
    def score(self) -> float:
        """What the search maximises: the measured value, 0 for a failed or skipped trial."""
        return self.value if self.status == "ok" and self.value is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrialSpec:
    """A trial to run, or to reuse when an earlier tune left its record."""
    step: int | str
    label: str
    params: dict[str, Any]
    overrides: list[str]
    role: str = "search"
    prediction: Optional[dict[str, Any]] = None


class TrialRunner:
    """Runs trials into OUT/step<N>/ and finds the records an earlier tune left there."""

    def __init__(self, out: Path):
        self.out = out

    @staticmethod
    def compose(overrides: list[str]) -> BenchConfig:
        """A validated config (composed once per override list: Hydra takes ~0.4 s a time)."""
        return copy.deepcopy(_compose(tuple(overrides)))

    def step_dir(self, step: int | str) -> Path:
        """OUT/step<N>/ for a step; a str is a folder under OUT (the confirmation's, confirm/<winner>)."""
        return self.out / (step if isinstance(step, str) else f"step{step}")

    def existing(self, step: int | str) -> dict[tuple[str, ...], list[tuple[str, ResultRecord]]]:
        """Records already in the step's folder, by trial key: [(path relative to OUT, record)]."""
        found: dict[tuple[str, ...], list[tuple[str, ResultRecord]]] = {}
        folder = self.step_dir(step)
        loaded = load_records([folder]) if folder.is_dir() else Loaded()
        for path, rec in loaded.records:
            found.setdefault(trial_key(rec.overrides), []).append((str(path.relative_to(self.out)), rec))
        return found

    def run(self, step: int | str, name: str, overrides: list[str]) -> list[tuple[str, ResultRecord]]:
        """Launch one trial as an ordinary run; its records (path relative to OUT, record)."""
        return self.run_many(step, [(name, overrides)])[0]

    def run_many(self, step: int | str, trials: list[tuple[str, list[str]]]) -> list[list[tuple[str, ResultRecord]]]:
        """Launch trials (name, overrides) together, as bench launches a sweep: under Slurm one job
        array (bench.array_groups), locally one after the other. Each trial's records, in order."""
        folder = self.step_dir(step)
        index = len(list((folder / "runs").iterdir())) if (folder / "runs").is_dir() else 0
        planned, ids, images = [], [], checked_images()
        for name, overrides in trials:
            mine = plan_runs(self.compose(overrides), name, index, overrides, folder, images)
            index += len(mine)
            planned += mine
            ids.append([i for p in mine for i in p.run.record_ids()])
        for p in planned:
            if p.run.run_dir.exists():  # an interrupted attempt: no record, start afresh
                shutil.rmtree(p.run.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        records = {r.run_id: r for r in execute(planned, folder, multirun=True)}
        out = []
        for (name, _), mine in zip(trials, ids):
            if not any(i in records for i in mine):
                raise HarnessError(f"trial {name} produced no record")
            out.append([(str((folder / f"{i}.json").relative_to(self.out)), records[i])
                        for i in mine if i in records])
        return out


def repo_relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
