"""A straggler across nights: a rank (or a node) that lags a little more each night never stands out on one night
(harness/held_up.py straggler: STRAGGLER_PCT of the profiled steps and STRAGGLER_RATIO times the next), until the
night its lag costs a metric its tolerance. The nightly follows, per run id, each rank's and each node's share of
the profiled steps it held the others back (the median over a night's repeats), and names the one whose share rose
every night of the last CREEP_NIGHTS, to CREEP_PCT or more tonight, by CREEP_RISE points or more: "held the others
back more each night". Tonight's own stragglers (night_stragglers) come first, each with its rise where it rose
every night; then the runs whose straggler rose every night without standing out tonight. `nightly --fail-on
straggler` fails on either."""
from __future__ import annotations

import statistics
from typing import Any

from .held_up import night_stragglers, shares, standing_out, who

CREEP_NIGHTS = 3
"""Nights in the trend, tonight included: the shortest run of nights in which 'more each night' means something."""
CREEP_PCT = 6.0
CREEP_RISE = 3.0
"""Tonight's share of the profiled steps (the median of its repeats) at least CREEP_PCT, and CREEP_RISE points more
than CREEP_NIGHTS - 1 nights ago, each night more than the last. Measured on the 2-core Zen 5 box (2026-12-06, 8 quiet
nights of the cpu nightly, 3 repeats each; tests/perf/straggler_nights.py): the median share of each rank of its two
llama-tiny runs was 0.1-4.2 %, and of the 672 orderings of three of those nights none would be named (at 4 % and 2
points, 21). Then rank 1 slept 0.005, 0.01, 0.02 and 0.03 s a micro-step on four nights: 3.7, 7.1, 11.7 and 14.2 %
(ZeRO-1), 1.8, 6.3, 12.2 and 15.0 % (ZeRO-2); both named from the second of those nights (1 %, 4 %, 7 % and 1 %, 2 %,
6 %), two nights before a repeat first stood out (15 % and 3x the next: one of three repeats, two of three, on the
fourth night)."""


def medians(repeats: list[dict[Any, float]]) -> dict[Any, float]:
    """Of one run id's repeats' shares ({who: %} each), each one's median; a rank missing from a repeat counts 0."""
    return {key: statistics.median(s.get(key, 0.0) for s in repeats) for key in {k for s in repeats for k in s}}


def rises(series: list[float]) -> bool:
    """Whether a share (oldest night first) held the others back more each night, enough to be named."""
    return (len(series) >= CREEP_NIGHTS and series[-1] >= CREEP_PCT and series[-1] - series[0] >= CREEP_RISE
            and all(b > a for a, b in zip(series, series[1:])))


def _night_shares(records: list) -> dict[str, dict[tuple[str, Any], float]]:
    """{run id: {("ranks", rank) | ("hosts", host): the median over the night's repeats of its held-back share}};
    a repeat without matched calls counts for none."""
    per_run: dict[str, list[dict[tuple[str, Any], float]]] = {}
    for r in records:
        one = {(per, k): v for per in ("ranks", "hosts") for k, v in shares(r.steps, per).items()}
        if one:
            per_run.setdefault(r.run_id, []).append(one)
    return {run_id: medians(repeats) for run_id, repeats in per_run.items()}


def _named(per: str, key: Any, records: list) -> str:
    """'rank 1 (vm)' or 'node node2 (ranks 2, 3)', from a record's arrivals."""
    for r in records:
        for s in r.steps:
            for one in (s.get("arrivals") or {}).get(per, ()):
                if one.get("rank" if per == "ranks" else "host") == key:
                    return who({k: one[k] for k in ("rank", "host", "ranks") if k in one})
    return f"{per[:-1]} {key}"


def _by_night(tonight: list, night: str, earlier: list[tuple[str, Any]],
              nights: list[str]) -> dict[str, dict[str, dict[tuple[str, Any], float]]]:
    """{night: _night_shares of its records} for the earlier `nights` and tonight."""
    out = {n: _night_shares([r for m, r in earlier if m == n]) for n in nights}
    out[night] = _night_shares(tonight)
    return out


def trends(tonight: list, night: str, earlier: list[tuple[str, Any]], earlier_nights: list[str]) -> dict[str, str]:
    """{run id: 'rank 1 (vm) held the others back more each night: 1 %, 4 %, 7 % of the profiled steps (nights ...)'}
    for each run id of tonight whose latest rank (or, where the ranks span hosts, node) held the others back more each
    night of the last CREEP_NIGHTS (rises); none where fewer nights ran it."""
    nights = earlier_nights[-(CREEP_NIGHTS - 1):] + [night]
    if len(nights) < CREEP_NIGHTS:
        return {}
    by_night = _by_night(tonight, night, earlier, nights[:-1])
    out = {}
    for run_id, now in by_night[night].items():
        if any(run_id not in by_night[n] for n in nights):
            continue
        for per in ("ranks", "hosts"):
            mine = {k: v for k, v in now.items() if k[0] == per}
            if not mine or (per == "hosts" and len(mine) < 2):
                continue
            key = max(mine, key=mine.get)
            series = [by_night[n][run_id].get(key, 0.0) for n in nights]
            if rises(series):
                out[run_id] = (f"{_named(per, key[1], [r for r in tonight if r.run_id == run_id])} held the others "
                               f"back more each night: {', '.join(f'{v:.0f} %' for v in series)} of the profiled "
                               f"steps (nights {', '.join(nights)}; the median of each night's repeats)")
                break
    return out


def held_back_series(tonight: list, night: str, earlier: list[tuple[str, Any]],
                     earlier_nights: list[str]) -> dict[str, dict[str, list[tuple[str, float]]]]:
    """For the nightly page's chart: {run id of tonight: {'rank 1 (vm)' | 'node node2 (ranks 2, 3)': [(night, the
    median of that night's repeats' share of the profiled steps it held the others back)]}} over the baseline's
    nights and tonight: on one host each rank; where the ranks spanned hosts each node, and of the ranks only those
    that held the others back most on some night (a cluster of 8 GPUs a node has too many ranks to draw)."""
    by_night = _by_night(tonight, night, earlier, earlier_nights)
    out: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for run_id, now in by_night[night].items():
        recs = [r for r in tonight if r.run_id == run_id]
        spans = sum(per == "hosts" for per, _ in now) > 1
        nights = [n for n in earlier_nights + [night] if run_id in by_night[n]]
        latest = {max((k for k in by_night[n][run_id] if k[0] == "ranks"), key=by_night[n][run_id].get,
                      default=None) for n in nights}
        lines: dict[str, list[tuple[str, float]]] = {}
        for n in nights:
            for (per, key), pct in sorted(by_night[n][run_id].items(), key=lambda kv: str(kv[0])):
                if (per == "hosts" and spans) or (per == "ranks" and (not spans or (per, key) in latest)):
                    lines.setdefault(_named(per, key, recs), []).append((n, pct))
        out[run_id] = lines
    return out


def night_straggler_lines(tonight: list, night: str, earlier: list[tuple[str, Any]],
                          earlier_nights: list[str]) -> list[str]:
    """What the nightly says of stragglers: tonight's (night_stragglers), each with its trend where it rose every
    night, then the runs whose straggler did not stand out tonight but rose every night (the trend alone)."""
    rising = trends(tonight, night, earlier, earlier_nights)
    stood = night_stragglers(tonight, rising)
    named = standing_out(tonight)
    benchmark = {r.run_id: r.benchmark for r in tonight}
    return stood + [f"{run_id} ({benchmark[run_id]}): {text}" for run_id, text in rising.items() if run_id not in named]
