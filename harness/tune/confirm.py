"""A tune's claimed speedup is a verdict too: after the search, the winner and the default
configuration are re-measured `tune.confirm_repeats` times each, interleaved (default, winner,
default, winner, ...: a box that drifts drifts under both), through the trials' own path (under
Slurm: one job array). The gain is the ratio of the medians, with the 95% bootstrap interval of
harness/verdict/compare.py (both sides resampled, seeded):
- "significant gain"   the whole interval lies above 1x: the winner is kept;
- "no significant gain" otherwise (one lucky sample of a noisy box is not a gain): the default
                        configuration is kept, and it is what the preset installs;
- "insufficient data"  a side has fewer than two samples that ran and passed loss parity: the
                        default is kept;
- "default is best"    the search found nothing better than the default: nothing to confirm.
The runs are ordinary records under OUT/confirm/<winner>-<hash of its overrides>/: a resumed tune
reuses them (the i-th record of a side is its i-th sample) and runs only the rest of the
interleaved schedule; another winner (a resume with other tune.* settings) gets its own folder,
so its pairs are never mixed with another winner's."""
from __future__ import annotations

import hashlib
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..verdict.compare import bootstrap_interval, worse_pct
from ..plan import safe_name
from ..record import ResultRecord
from .trials import Trial, TrialSpec, trial_key

STEP = "confirm"
DEFAULT, WINNER = "default", "winner"
GAIN, NO_GAIN, INSUFFICIENT, DEFAULT_BEST = ("significant gain", "no significant gain", "insufficient data",
                                             "default is best")


@dataclass
class Judgement:
    """The verdict on a winner's gain over the default from interleaved samples (samples/s)."""
    verdict: str
    kept: str
    """winner | default: the configuration the tune hands out."""
    ratio: Optional[float] = None
    """median(winner) / median(default)."""
    interval: Optional[tuple[float, float]] = None
    """95% bootstrap interval of the ratio."""
    gain_pct: Optional[float] = None
    gain_interval_pct: Optional[tuple[float, float]] = None

    def figure(self) -> str:
        """"1.31x the default (95 % interval [1.22, 1.40])", or "" when nothing was judged. A bound near 1x
        gets the digits that keep it off 1.00 ([1.004, 1.12], not [1.00, 1.12] for a gain it confirmed)."""
        return (f"{self.ratio:.2f}x the default (95 % interval [{_times(self.interval[0])}, {_times(self.interval[1])}])"
                if self.ratio is not None and self.interval is not None else "")

    def text(self) -> str:
        figure = self.figure()
        if self.verdict == GAIN:
            return figure
        if self.verdict == NO_GAIN:
            return f"no significant gain ({figure}): the default configuration is kept"
        if self.verdict == DEFAULT_BEST:
            return "the default configuration is the best found: nothing to confirm"
        return f"insufficient data to confirm a gain{f' ({figure})' if figure else ''}: the default configuration is kept"


def _times(value: float, digits: int = 2) -> str:
    """A ratio with 2 decimals, more (up to 4) while it would read 1.00 without being 1."""
    text = f"{value:.{digits}f}"
    return _times(value, digits + 1) if float(text) == 1.0 and value != 1.0 and digits < 4 else text


def judge(default: list[float], winner: list[float]) -> Judgement:
    """Significant gain when the whole 95% interval of median(winner)/median(default) is above 1."""
    if min(len(default), len(winner)) < 2:
        return Judgement(INSUFFICIENT, DEFAULT)
    worse = worse_pct(statistics.median(winner), statistics.median(default), "higher")  # positive = slower
    lo, hi = bootstrap_interval(winner, default, "higher")
    gain_pct, gain_interval = -worse, (-hi, -lo)
    ratio, interval = 1 + gain_pct / 100, (1 + gain_interval[0] / 100, 1 + gain_interval[1] / 100)
    verdict = GAIN if gain_interval[0] > 0 else NO_GAIN
    return Judgement(verdict, WINNER if verdict == GAIN else DEFAULT, ratio, interval, gain_pct, gain_interval)


def schedule(repeats: int, done_default: int = 0, done_winner: int = 0) -> list[str]:
    """The runs still to make of the interleaved schedule (default, winner) x repeats, given how many
    of each side an earlier (interrupted) confirmation left: its first ones are done."""
    todo, skip = [], {DEFAULT: done_default, WINNER: done_winner}
    for side in [DEFAULT, WINNER] * repeats:
        if skip[side]:
            skip[side] -= 1
        else:
            todo.append(side)
    return todo


def folder_of(winner: Trial) -> str:
    """OUT-relative folder of a winner's confirmation: its pairs are never mixed with another winner's."""
    digest = hashlib.sha1("\n".join(trial_key(winner.overrides)).encode()).hexdigest()[:8]
    return f"{STEP}/{safe_name(winner.label)}-{digest}"


@dataclass
class Confirmation:
    """What the confirmation measured and decided (tune.json's "confirmation")."""
    winner: str
    winner_overrides: list[str]
    default_overrides: list[str]
    repeats: int
    folder: Optional[str]
    judgement: Judgement
    search_value: Optional[float] = None
    """The winner's samples/s in its one search trial (the claim being confirmed)."""
    trials: list[Trial] = field(default_factory=list)
    """Every re-measurement in the order it was launched (or, reused, first launched)."""

    def samples(self, side: str) -> list[float]:
        """samples/s of one side's runs that ran and passed loss parity."""
        return [t.value for t in self.trials if t.role == f"confirm-{side}" and counts(t)]

    @property
    def keeps_winner(self) -> bool:
        return self.judgement.kept == WINNER

    def headline(self) -> str:
        """The one line a user reads: what is kept, and why."""
        sides = {side: self.samples(side) for side in (DEFAULT, WINNER)}
        over = (f"; medians {statistics.median(sides[WINNER]):.4g} vs {statistics.median(sides[DEFAULT]):.4g} "
                f"samples/s over {self.repeats} interleaved pairs" if all(sides.values()) else "")
        if self.keeps_winner:
            return f"best: {self.winner}: {self.judgement.text()}{over}"
        claim = f"{self.search_value:.4g} samples/s in one trial" if self.search_value is not None else "search's best"
        return (f"best: the default configuration: {self.judgement.text()}{over}"
                + (f" (the search's best, {self.winner}: {claim})" if self.judgement.verdict != DEFAULT_BEST else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"winner": self.winner, "winner_overrides": self.winner_overrides,
                "default_overrides": self.default_overrides, "repeats": self.repeats, "folder": self.folder,
                "search_value": self.search_value,
                "order": [t.role.removeprefix("confirm-") for t in self.trials],
                "default_samples_per_s": self.samples(DEFAULT), "winner_samples_per_s": self.samples(WINNER),
                **asdict(self.judgement), "decision": f"keep the {self.judgement.kept}", "text": self.judgement.text(),
                "trials": [t.to_dict() for t in self.trials]}


def counts(t: Trial) -> bool:
    """A re-measurement is a sample when it ran and trains like the default (loss parity)."""
    return t.status == "ok" and t.value is not None and (t.parity is None or t.parity.get("ok") is not False)


def _run_index(entry: tuple[str, ResultRecord]) -> int:
    head = entry[1].run_id.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def confirm(tuner, winner: Trial) -> Confirmation:
    """Re-measure `winner` and the default configuration, interleaved, and judge the gain."""
    repeats, base = tuner.tune.confirm_repeats, list(tuner.base)
    if trial_key(winner.overrides) == trial_key(base):
        return Confirmation(winner.label, list(winner.overrides), base, repeats, None, Judgement(DEFAULT_BEST, DEFAULT),
                            winner.value)
    folder = folder_of(winner)
    specs = {DEFAULT: TrialSpec(STEP, "default", {}, base, role=f"confirm-{DEFAULT}"),
             WINNER: TrialSpec(STEP, winner.label, dict(winner.params), list(winner.overrides), role=f"confirm-{WINNER}")}
    existing = tuner.runner.existing(folder)
    found = {side: sorted(existing.get(trial_key(sp.overrides), []), key=_run_index)[:repeats]
             for side, sp in specs.items()}
    todo = schedule(repeats, len(found[DEFAULT]), len(found[WINNER]))
    print(f"\n[tune confirm] {winner.label} against the default, {repeats} interleaved pairs"
          + (f"; {len(todo)} runs to launch" + (" (one Slurm job array)" if tuner.batched and len(todo) > 1 else "")
             if todo else ": every run reused"), flush=True)
    fresh: list[tuple[str, list[tuple[str, ResultRecord]]]] = []
    if todo:
        rounds = {DEFAULT: len(found[DEFAULT]), WINNER: len(found[WINNER])}
        names = []
        for side in todo:
            rounds[side] += 1
            names.append((f"{specs[side].label}-{rounds[side]}", specs[side].overrides))
        fresh = list(zip(todo, tuner.runner.run_many(folder, names)))
    reused = sorted(((side, rec) for side in (DEFAULT, WINNER) for rec in found[side]), key=lambda x: _run_index(x[1]))
    trials = [tuner.judge(specs[side], [rec], reused=True) for side, rec in reused]
    trials += [tuner.judge(specs[side], done, reused=False) for side, done in fresh]
    result = Confirmation(winner.label, list(winner.overrides), base, repeats, folder, Judgement(INSUFFICIENT, DEFAULT),
                          winner.value, trials)
    result.judgement = judge(result.samples(DEFAULT), result.samples(WINNER))
    print(f"[tune confirm] {winner.label}: {result.judgement.text()}", flush=True)
    return result
