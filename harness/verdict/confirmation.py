"""A regression one run reads is run again before a bench calls it (config key `confirm_regressions`).

Why. A bench runs each configuration once, and one run of a host-paced figure can be a spell of the host: a first
bench on a fresh clone of the suite judged reduce_scatter's small_median_us 2.42x its reference (390 against 161
us) with every pulse calm, and three reruns right after read 175-197 us (docs/verdicts.md "A regression is
run again"). A team acting on a regression wants one that repeats. So where a run's first records read a
regression (against reference_results/ or this machine's baseline), `bench` runs that run `confirm_regressions`
times more, after the suite's other runs (minutes later: past a spell of seconds), each an ordinary run with its
own run id (`<run id>-confirm<k>`) and record in the bench's folder, and the verdicts are those of all its runs:
the median of three, bootstrap interval and tolerance as ever (compare.decide). A regression that repeats stays
one and says how many of the runs read it; one that does not is judged on the median like any repeats. The
nightly job repeats every run already (`--repeats`), tune confirms its winner itself: neither runs this.

This module decides which runs to run again and writes what the confirmation found; bench.py launches them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from contract.metrics import METRICS

from ..report.verdicts import value_text
from .compare import Verdict
from .explained import worse_pct

SUFFIX = "-confirm"
"""A rerun's run name and id end with this and its number: 03-z2-mb2-ga4-confirm1."""


def rerun_name(name: str, k: int) -> str:
    return f"{name}{SUFFIX}{k}"


def _split(run_id: str) -> tuple[str, int]:
    """(the first run's id, k) of a k-th rerun's run or record id; (run_id, 0) of a first run's."""
    head, sep, tail = run_id.partition(SUFFIX)
    rest = tail.lstrip("0123456789")
    return (head + rest, int(tail[:len(tail) - len(rest)])) if sep and rest != tail else (run_id, 0)


def first_run_id(run_id: str) -> str:
    """The run id a rerun's record id (or a first run's) stands for: 00-collectives-confirm2-all_reduce and
    00-collectives-all_reduce -> 00-collectives-all_reduce; a first run's id unchanged."""
    return _split(run_id)[0]


def rerun_number(run_id: str) -> int:
    """0 for a first run's id (or its record's), k for its k-th rerun's."""
    return _split(run_id)[1]


def regressions(verdicts: Iterable[Verdict]) -> list[Verdict]:
    return [v for v in verdicts if v.verdict == "regression"]


@dataclass
class FirstReading:
    """The verdicts of a bench's first runs, before any ran again: against reference_results/ and against this
    machine's baseline (what no reference of this machine judged: harness/verdict/baseline.py)."""
    reference: list[Verdict]
    baseline: list[Verdict]

    @property
    def all(self) -> list[Verdict]:
        return self.reference + self.baseline

    def against(self, v: Verdict) -> str:
        return "baseline" if any(v is b for b in self.baseline) else "reference"


def to_confirm(verdicts: Iterable[Verdict], record_ids: dict[str, list[str]]) -> list[str]:
    """The runs (their run ids, in `record_ids`' order: run id -> the record ids it writes) whose records a
    regression verdict was judged on."""
    regressed = {rid for v in regressions(verdicts) for rid in v.run_ids}
    return [run for run, ids in record_ids.items() if regressed.intersection(ids)]


@dataclass
class Confirmed:
    """One regression the first run read, and what its reruns read."""
    first: Verdict
    values: list[float]
    """The metric in each of the configuration's runs, the first one first."""
    now: Optional[Verdict]
    """The verdict on all its runs (None when no verdict of that metric and reference came back)."""
    failed: tuple[str, ...] = ()
    """The status of each rerun that did not measure it (error, timeout, oom)."""
    against: str = "reference"
    """What the first verdict judged it against: 'reference' (reference_results/) or 'baseline' (this machine's)."""

    def outcome(self) -> str:
        """'confirmed' (a regression on all the runs together), 'not repeated' (another verdict on them, and no rerun
        read it beyond the tolerance: the first run's reading alone), 'unsettled' (another verdict on them, but a
        rerun read it too: a spell that lasted into the reruns, or a change the runs cannot tell; more runs would),
        or 'no verdict'."""
        if self.now is None:
            return "no verdict"
        if self.now.verdict == "regression":
            return "confirmed"
        return "unsettled" if self.slower() > 1 else "not repeated"

    def slower(self) -> int:
        """How many of the runs read it beyond the tolerance, on the worse side of the first verdict's reference."""
        ref, tol = self.first.reference, self.first.tolerance_pct
        if not ref or tol is None:
            return 0
        return sum(1 for x in self.values if worse_pct(x, ref, METRICS[self.first.metric].direction, self.first.metric)
                   > tol)

    def line(self) -> str:
        v, unit = self.first, f" {self.first.unit}" if self.first.unit else ""
        reruns = ", ".join([*(value_text(x, v.unit) for x in self.values[1:]), *self.failed]) or "none recorded"
        n, beyond = len(self.values), self.slower()
        if self.now is None:
            outcome = "no verdict on the runs together"
        elif self.outcome() == "confirmed":
            outcome = f"regression, confirmed: {beyond} of {n} runs read it"
        elif self.outcome() == "unsettled":
            outcome = (f"{self.now.verdict} on the median of {n} runs ({value_text(self.now.value, v.unit)}{unit}): "
                       f"unsettled, {beyond} of {n} runs read it beyond the tolerance (more runs would tell)")
        else:
            outcome = (f"{self.now.verdict} on the median of {n} runs ({value_text(self.now.value, v.unit)}{unit}): "
                       f"the first run's reading did not repeat ({beyond} of {n} runs beyond the tolerance)")
        run = first_run_id(v.run_ids[0]) if v.run_ids else "?"
        return (f"{run}: {v.benchmark} {v.metric} read {value_text(v.value, v.unit)}{unit} against "
                f"{value_text(v.reference, v.unit)} in its first run; its reruns {reruns}: {outcome}")


def _same(a: Verdict, b: Verdict) -> bool:
    return (a.platform, a.benchmark, a.metric, a.reference_platform) == (b.platform, b.benchmark, b.metric,
                                                                          b.reference_platform) \
        and a.config == b.config and a.reference == b.reference


def confirmed(first: FirstReading, final: list[Verdict], records: list[Any]) -> list[Confirmed]:
    """Each regression of `first` with the values of its configuration's runs among `records` (the first run's,
    then its reruns', in order) and the verdict of `final` on the same metric against the same reference."""
    out = []
    for v in regressions(first.all):
        ids = {first_run_id(r) for r in v.run_ids}
        runs = sorted((r for r in records if first_run_id(r.run_id) in ids), key=lambda r: rerun_number(r.run_id))
        values = [float(r.metrics[v.metric]["value"]) for r in runs if v.metric in r.metrics]
        failed = tuple(r.status for r in runs if v.metric not in r.metrics)
        now = next((f for f in final if _same(f, v)), None)
        out.append(Confirmed(v, values, now, failed, first.against(v)))
    return out


def section(found: list[Confirmed], times: int) -> str:
    """The bench's lines on its confirmation (printed and in compare.md); empty when nothing was run again."""
    if not found:
        return ""
    runs = len({first_run_id(c.first.run_ids[0]) for c in found if c.first.run_ids})
    kept = sum(1 for c in found if c.outcome() == "confirmed")
    head = (f"Regressions run again (confirm_regressions={times}): {len(found)} regression(s) of {runs} run(s) in "
            f"their first run, {kept} of them on all the runs together; each such run ran {times} more time(s) "
            "after the suite, and the tables above judge all its runs (their median).")
    return head + "\n" + "\n".join(f"  {c.line()}" for c in found)
