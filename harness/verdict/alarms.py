"""How often a regression that one run of a bench (a night's first repeat) read did not repeat, per machine and metric.

Why. A bench that runs its regressions again (config key confirm_regressions; harness/verdict/confirmation.py)
learns, each time, whether one run's reading was a change or a spell of the host; printed in compare.md, that is
gone by the next bench. Kept in the history store beside the bench's records (tables confirm_benches and
confirmations: store migration 0004), a team's CI counts over months how often a metric's first reading raised a
false alarm on a machine (what a bench without confirmation would have failed on), and how far beyond the
reference those readings lay against the tolerance that judged them: the data to set the platform's tolerance
(contract/metrics.py) and confirm_regressions from, instead of a few dozen sweeps on one box.

Kept: every bench with confirm_regressions >= 1 and a store (history != none), with the number of first verdicts
of each metric it judged (a value against a reference of its machine: the rate's denominator), and each regression
its first runs read with its reruns' values and the verdict on all its runs. And every nightly night of two or more
repeats (keep_night): its first repeat judged alone, against the references and the rolling baseline that judged the
night, is what a one-repeat nightly would have read, and the night's other repeats are its reruns (nothing runs
for it: the night repeats every run anyway). Read by `python -m harness alarms`, which says how many benches and
nights it counts.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.schema import REPO_ROOT
from ..errors import HarnessError
from ..record import ResultRecord
from ..report.legend import wrap
from ..report.summary import text_table
from .baseline import STORE_REMEDY, machine_key, store_url
from .confirmation import Confirmed, FirstReading
from .history import DEFAULT_URL, History, repo_url, store_file, store_name
from .one_run import TARGET_PCT, advise, check_target, units_of

JUDGED = ("pass", "regression", "improvement", "insufficient data")
"""A first verdict that read a value against a reference of its machine: one that could have been a regression."""
OUTCOMES = ("confirmed", "unsettled", "not repeated", "no verdict")
"""What the runs together said of a first run's regression (confirmation.Confirmed.outcome)."""


def keep_night(store: History, first: FirstReading, found: list[Confirmed], records: list[ResultRecord], out: Path,
               repeats: int) -> str:
    """One nightly night's first repeat, judged alone (first) and against all the night's repeats (found:
    confirmation.confirmed), kept in its store like a bench's confirmation with the night's folder as its key (a
    night resumed and judged again replaces it): its line for the nightly's output, or why it was not kept."""
    machine = machine_key(records)
    if machine is None or not records:
        return ""
    platform = records[0].platform
    try:
        store.add_confirmations(machine, platform, str(Path(out).resolve()), repeats - 1,
                                json.dumps(judged_counts(first)), rows_of(found), source="nightly")
        one = advise(*units_of(*store.confirmation_rows(platform), machine, platform, "nightly"))
    except HarnessError as exc:
        return f"first repeat alone: not kept: {exc}"
    outcomes = Counter(c.outcome() for c in found)
    read = (f"{len(found)} regression(s), of which {outcomes['confirmed']} the night's {repeats} repeats read too, "
            f"{outcomes['unsettled']} unsettled and {outcomes['not repeated']} that did not repeat"
            if found else "no regression")
    return (f"first repeat alone (what a one-repeat night would have judged): {read}; kept in {store.name} "
            f"(`python -m harness alarms` counts how often a first reading did not repeat); {one.over_nights()}")


def judged_counts(first: FirstReading) -> list[list[Any]]:
    """[benchmark, metric, against, how many first verdicts judged it], sorted."""
    counts = Counter((v.benchmark, v.metric, side) for side, vs in (("reference", first.reference),
                                                                    ("baseline", first.baseline))
                     for v in vs if v.verdict in JUDGED)
    return [[*key, n] for key, n in sorted(counts.items())]


def rows_of(found: list[Confirmed]) -> list[dict[str, Any]]:
    """The store's rows of one bench's confirmation (table confirmations), one per regression its first runs read."""
    rows = {}
    for c in found:
        v = c.first
        if v.value is None or v.reference is None:
            continue
        key = (v.run_ids[0] if v.run_ids else "?", v.metric, c.against)
        rows[key] = dict(record_id=key[0], metric=v.metric, against=c.against, benchmark=v.benchmark, unit=v.unit,
                         reference=v.reference, tolerance_pct=v.tolerance_pct, first_value=v.value,
                         first_worse_pct=v.worse_pct if v.worse_pct is not None else 0.0,
                         reruns=json.dumps(c.values[1:]), failed=json.dumps(list(c.failed)), beyond=c.slower(),
                         outcome=c.outcome(), final_verdict=c.now.verdict if c.now else None,
                         final_value=c.now.value if c.now else None)
    return list(rows.values())


def keep_confirmations(first: FirstReading, found: list[Confirmed], records: list[ResultRecord], history: str,
                       out: Path, times: int) -> str:
    """Keep one bench's confirmation in its history store (one transaction; the folder kept again replaces it): a
    line saying where, when its first runs read a regression; '' when they read none or there is no store
    (history=none); else a note on why it was not kept. A store that cannot be used never fails the bench."""
    url, machine = store_url(history, out), machine_key(records)
    if url is None or machine is None or not records:
        return ""
    try:
        History(url, remedy=STORE_REMEDY).add_confirmations(machine, records[0].platform, str(Path(out).resolve()),
                                                            times, json.dumps(judged_counts(first)), rows_of(found))
    except HarnessError as exc:
        return f"confirmation not kept: {str(exc)}"
    return (f"Kept in the history store ({store_name(url)}): `python -m harness alarms --store {url}` counts how "
            "often a first run's regression did not repeat on this machine.") if found else ""


@dataclass
class Tally:
    """One machine's, platform's, metric's and side's (reference or baseline) first readings."""
    judged: int = 0
    benches: int = 0
    nights: int = 0
    """The benches and the nightly nights that judged it."""
    outcomes: Counter = field(default_factory=Counter)
    worse: dict[str, list[float]] = field(default_factory=lambda: {o: [] for o in OUTCOMES})
    tolerances: set[float] = field(default_factory=set)

    @property
    def read(self) -> int:
        return sum(self.outcomes.values())

    def rate(self) -> str:
        return f"{100 * self.outcomes['not repeated'] / self.judged:.1f} %" if self.judged else "-"

    def separating(self) -> str:
        """The tolerance that would have passed every first reading that did not repeat, and whether it would
        still have caught every confirmed one."""
        fa, kept = self.worse["not repeated"], self.worse["confirmed"]
        if not fa:
            return "-"
        needed = math.floor(max(fa)) + 1
        if kept and min(kept) <= needed:
            return f"none ({sum(1 for x in fa if x >= min(kept))} at or beyond the smallest confirmed, {min(kept):.0f} %)"
        return f">= {needed} %" + (f" (below the smallest confirmed, {min(kept):.0f} %)" if kept else "")


def tallies(benches: list[Any], rows: list[Any]) -> dict[tuple, dict[tuple, Tally]]:
    """{(machine, platform): {(benchmark, metric, against): Tally}} of the store's rows."""
    out: dict[tuple, dict[tuple, Tally]] = {}
    for b in benches:
        for benchmark, metric, against, n in json.loads(b.judged):
            t = out.setdefault((b.machine, b.platform), {}).setdefault((benchmark, metric, against), Tally())
            t.judged = t.judged + n
            if b.source == "nightly":
                t.nights += 1
            else:
                t.benches += 1
    for r in rows:
        t = out.setdefault((r.machine, r.platform), {}).setdefault((r.benchmark, r.metric, r.against), Tally())
        t.outcomes[r.outcome] += 1
        t.worse[r.outcome].append(r.first_worse_pct)
        if r.tolerance_pct is not None:
            t.tolerances.add(r.tolerance_pct)
    return out


def _span(xs: list[float]) -> str:
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return f"{lo:+.0f} %" if round(lo) == round(hi) else f"{lo:+.0f} to {hi:+.0f} %"


HEADERS = ["benchmark", "metric", "against", "judged", "read", "confirmed", "unsettled", "not repeated", "false alarms",
           "first read: not repeated", "first read: confirmed", "tolerance", "a tolerance passing the not repeated"]


def report(benches: list[Any], rows: list[Any], store: str, every: bool = False, markdown: bool = False,
           target_pct: float = TARGET_PCT) -> str:
    """The text of `python -m harness alarms`: per machine and platform, one line of counts and whether one run
    would do there (harness/verdict/one_run.py), then a row per metric that read a regression (every metric judged
    with `every`)."""
    if not benches:
        return (f"No bench in {store} ran its regressions again yet, and no nightly of two or more repeats was kept "
                "there (a bench with confirm_regressions >= 1 and history kept there keeps what its reruns read; a "
                "nightly, what its first repeat read alone against all its repeats).")
    parts = [f"Regressions a bench's first run (a night's first repeat) read, and whether its reruns (the night's "
             f"other repeats) read them too ({store}; a first reading beyond the reference in % worse; false alarms: "
             "those that did not repeat, per first verdict judged)"]
    for (machine, platform), by in sorted(tallies(benches, rows).items()):
        mine = [b for b in benches if (b.machine, b.platform) == (machine, platform)]
        dates = sorted(b.created_utc[:10] for b in mine)
        nights = sum(1 for b in mine if b.source == "nightly")   # every row has one since 0005
        total = Counter()
        for t in by.values():
            total.update(t.outcomes)
        judged = sum(t.judged for t in by.values())
        kinds = " and ".join(x for x in (f"{len(dates) - nights} bench(es)" if len(dates) > nights else "",
                                         f"{nights} night(s)" if nights else "") if x)
        parts.append(f"{platform} on {machine}: {kinds} from {dates[0] if dates else '?'} to "
                     f"{dates[-1] if dates else '?'}; {judged} first verdict(s) judged over {len(by)} metric(s); "
                     f"{sum(total.values())} regression(s) read: {total['confirmed']} confirmed, "
                     f"{total['unsettled']} unsettled, {total['not repeated']} did not repeat, "
                     f"{total['no verdict']} without a verdict")
        parts.append(advise(*units_of(benches, rows, machine, platform), target_pct).text)
        shown = [(k, t) for k, t in sorted(by.items()) if every or t.read]
        if shown:
            parts.append(text_table(HEADERS, [[b, m, a, str(t.judged), str(t.read), str(t.outcomes["confirmed"]),
                                               str(t.outcomes["unsettled"]), str(t.outcomes["not repeated"]), t.rate(), _span(t.worse["not repeated"]),
                                               _span(t.worse["confirmed"]),
                                               ", ".join(f"{x:g} %" for x in sorted(t.tolerances)) or "-",
                                               t.separating()]
                                              for (b, m, a), t in shown], markdown))
    return "\n\n".join(p if p.startswith(HEADERS[0]) or p.startswith("|") else "\n".join(wrap(p, "", ""))
                       for p in parts)


def as_json(benches: list[Any], rows: list[Any], target_pct: float = TARGET_PCT) -> list[dict[str, Any]]:
    """A row per machine, platform and metric; `one_run`, the machine's and platform's advice (the same in each of
    its rows)."""
    advice = {key: advise(*units_of(benches, rows, *key), target_pct).as_dict()
              for key in {(b.machine, b.platform) for b in benches}}
    return [{"machine": machine, "platform": platform, "benchmark": b, "metric": m, "against": a,
             "judged": t.judged, "benches": t.benches, "nights": t.nights, "read": t.read,
             **{o.replace(" ", "_"): t.outcomes[o] for o in OUTCOMES},
             "first_worse_pct": {o.replace(" ", "_"): t.worse[o] for o in OUTCOMES},
             "tolerance_pct": sorted(t.tolerances), "one_run": advice.get((machine, platform))}
            for (machine, platform), by in sorted(tallies(benches, rows).items()) for (b, m, a), t in sorted(by.items())]


def _url(url: str) -> str:
    """A relative SQLite file is the repository's (as the nightly's --store and make bench's results/); a store
    that is not there is refused, never created empty."""
    url = repo_url(url, REPO_ROOT)
    path = store_file(url)
    if path is not None and not Path(path).is_file():
        raise HarnessError(f"history store {store_name(url)} does not exist: a bench keeps its confirmations in the "
                           "history.sqlite beside its output folder (history=auto; results/ by default); name the "
                           "store with --store")
    return url


def cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness alarms", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    parser.add_argument("--platform", help="one platform's benches only")
    parser.add_argument("--all", action="store_true", help="a row for every metric judged, not only those that "
                                                            "read a regression")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--false-alarms", type=float, default=TARGET_PCT, metavar="PCT",
                        help="the share of benches or nights with a false alarm accepted from one run, in %% (default "
                             f"{TARGET_PCT:g}): whether one run would do on a machine is judged against it")
    ns = parser.parse_args(args)
    target = check_target(ns.false_alarms)
    url = _url(ns.store)
    benches, rows = History(url, remedy="name another with --store").confirmation_rows(ns.platform)
    if ns.json:
        print(json.dumps(as_json(benches, rows, target), indent=2))
    else:
        print(report(benches, rows, store_name(url), ns.all, ns.markdown, target))
    return 0
