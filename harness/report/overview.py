"""Every platform's nightly at a glance (issue 29 item 4): one page per history store, a row per
platform with its last night, how many runs it stored and failed, its verdicts against the reference
table and the rolling baseline, what changed where something regressed, the runs in which a rank or a node
stood out as the straggler (harness/held_up.py night_stragglers) or held the others back more each night
(harness/straggler_trend.py), what its first repeat read alone and whether one repeat would do on its machine
(harness/verdict/one_run.py), and a link to that night's own page. `python -m harness nightly --overview FILE [--store URL]` writes it."""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..held_up import night_stragglers
from ..verdict.compare import Verdict
from ..record import ResultRecord
from .legend import grouped
from .nightly_page import COMPARISONS, FAILURES, CSS
from .verdicts import VERDICT_ORDER, environment_text


@dataclass
class OverviewRow:
    platform: str
    night: str
    out_dir: Path
    finished_utc: Optional[str]
    records: list[ResultRecord]
    verdicts: dict[str, list[Verdict]]
    stragglers: Optional[list[str]] = None
    """tonight's and those creeping up across nights (harness/straggler_trend.py); tonight's own when None"""
    first_repeat: str = ""
    """what the night's first repeat read alone, and whether one repeat would do on its machine
    (harness/verdict/one_run.py night_cell); '' for a night of one repeat"""

    @property
    def straggler_lines(self) -> list[str]:
        return night_stragglers(self.records) if self.stragglers is None else self.stragglers

    @property
    def failing(self) -> list[Verdict]:
        return [v for vs in self.verdicts.values() for v in vs if v.verdict in FAILURES]

    @property
    def failed_runs(self) -> int:
        return sum(r.status != "ok" for r in self.records)


def _counts(vs: list[Verdict]) -> str:
    counts = Counter(v.verdict for v in vs)
    return ", ".join(f"{counts[k]} {k}" for k in VERDICT_ORDER if counts[k]) or "no verdicts"


def _changed(row: OverviewRow) -> str:
    """What changed, once per distinct change among the failing verdicts, with how many share it."""
    return "; ".join(f"{change} ({len(group)} verdict{'' if len(group) == 1 else 's'})"
                     for change, group in grouped(row.failing, lambda v: environment_text(v.environment_diff)))


def overview_line(row: OverviewRow) -> str:
    state = "" if row.finished_utc else " (unfinished)"
    return (f"{row.platform} {row.night}{state}: {len(row.records)} runs, {row.failed_runs} failed; "
            + "; ".join(f"{name}: {_counts(vs)}" for name, vs in row.verdicts.items())
            + (f"; what changed: {_changed(row)}" if row.failing else "")
            + "".join(f"; straggler: {line}" for line in row.straggler_lines)
            + (f"; first repeat: {row.first_repeat}" if row.first_repeat else ""))


def overview_page(rows: list[OverviewRow], store: str) -> str:
    esc = html.escape
    title = "Nightlies: every platform's last night"
    bad = [r for r in rows if r.failing or r.failed_runs]
    head = "".join(f"<th>{esc(h)}</th>" for h in ("platform", "last night", "runs", *COMPARISONS.values(),
                                                    "what changed", "stragglers", "first repeat alone", "report"))
    body = ""
    for r in rows:
        report = r.out_dir / "nightly.html"
        link = f'<a href="{esc(report.as_uri())}">nightly.html</a>' if report.is_file() else "-"
        state = "" if r.finished_utc else " (unfinished)"
        body += (f'<tr class="{"regression" if r.failing else ""}"><td>{esc(r.platform)}</td>'
                 f"<td>{esc(r.night + state)}</td><td>{len(r.records)} ({r.failed_runs} failed)</td>"
                 + "".join(f"<td>{esc(_counts(r.verdicts.get(name, [])))}</td>" for name in COMPARISONS)
                 + f"<td>{esc(_changed(r)) if r.failing else '-'}</td>"
                 + f"<td>{'<br>'.join(map(esc, r.straggler_lines)) or '-'}</td>"
                 + f"<td>{esc(r.first_repeat) or '-'}</td><td>{link}</td></tr>")
    line = (f"{len(bad)} of {len(rows)} platform(s) with a regression, status change or failed run"
            if rows else "no night stored yet")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{esc(title)}</h1>"
            f'<p class="night {"bad" if bad else "good"}">{esc(line)}</p>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p><small>history store: {esc(store)}; each night judged as its nightly judged it</small></p>"
            "</body></html>\n")
