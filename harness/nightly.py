"""The nightly regression job: `make nightly PLATFORM=<name>` = `python -m harness nightly`.

    python -m harness nightly [--night ID] [--repeats N] [--store URL] [--baseline-nights N]
                              [--reference FILE|none ...] [--fail-on VERDICTS] [overrides ...]
    python -m harness nightly --overview FILE [--store URL] [--reference ...] [--baseline-nights N]

Runs the nightly suite (`suite=nightly-<platform>` unless overridden) `--repeats` times, keeps every run
in the history store (SQLite by default; PostgreSQL for a team's shared one), compares this night's runs
with the reference table and with a rolling baseline (the runs of the last `--baseline-nights` finished
nights of tonight's machine, machine_nights; `--reference` picks the reference tables, default every
reference_results/*.json, `none` for the baseline alone), and writes nightly.md, nightly.html
(harness/report/nightly_page.py) and junit.xml into OUT. A night is identified by `--night` (default:
today's date); running the same night again resumes it: runs already stored are not redone, runs written
to disk but not stored are stored from their files. Exit status 1 when a comparison finds a verdict in
--fail-on (default: regression, status changed; `straggler` adds a run in which one rank or node stood out as the
straggler, or held the others back more each night of the last three (harness/straggler_trend.py), which the reports
and the output name whatever the verdicts). --overview runs nothing: one page of every platform's
last night in the store (harness/report/overview.py).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
from datetime import date, datetime
from pathlib import Path
from typing import Optional

from contract.metrics import tolerances_for

from .bench import PlannedRun, checked_images, execute, plan_suite
from .verdict.alarms import keep_night
from .verdict.one_run import night_cell
from .verdict.baseline import machine_key
from .verdict.confirmation import FirstReading, confirmed
from .verdict.compare import VERDICTS, compare, outside_runs, parse_fail_on
from .verdict.cross_machine import names_agree
from .config.compose import compose
from .config.schema import REPO_ROOT
from .errors import HarnessError
from .verdict.history import DEFAULT_URL, History, repo_url
from .record import ResultRecord
from .verdict.record_files import load_record
from .verdict.references import REFERENCE_METRICS, load_references, record_config, references_from_records
from .straggler_trend import held_back_series, night_straggler_lines
from .report.legend import grouped
from .atomic import make_folder, write_bytes_atomic
from .report.nightly import write_reports
from .report.overview import OverviewRow, overview_line, overview_page
from .report.nightly_page import series_label
from .report.verdicts import OUTSIDE_SUITE, environment_text, unrun_line, verdict_text


def baseline_references(earlier: list[tuple[str, ResultRecord]], platform: str, nights: list[str],
                        left_out: str = ""):
    """The rolling baseline: earlier nights' runs aggregated like a submission (median, samples);
    its fingerprint is the last good night's, so a regression shows what changed since then. `left_out`:
    the nights of another machine the baseline passed over (machine_nights), said in its source."""
    records = [rec for _, rec in earlier]
    return references_from_records(list(reversed(records)), source=f"rolling baseline: nights {', '.join(nights)}"
                                   + (f" ({left_out})" if left_out else ""),
                                   submitter="nightly", date=nights[-1][:10] if nights else "1970-01-01",
                                   system=platform, tolerance_pct=tolerances_for(platform)) if records else []


def series(history: list[tuple[str, ResultRecord]]) -> dict[str, list[tuple[str, float]]]:
    """Per (benchmark, configuration, metric): the median over each night's repeats, oldest first."""
    values: dict[str, dict[str, list[float]]] = {}
    for night, rec in history:
        if rec.status != "ok":
            continue
        label = series_label(rec.platform, rec.benchmark, record_config(rec))
        for metric in REFERENCE_METRICS.get(rec.kind, {}):
            if metric in rec.metrics:
                name = f"{label} {metric}"
                values.setdefault(name, {}).setdefault(night, []).append(rec.metrics[metric]["value"])
    return {name: [(night, statistics.median(v)) for night, v in sorted(nights.items())]
            for name, nights in sorted(values.items())}


def written_not_stored(p: PlannedRun, out: Path, started_utc: Optional[str]) -> list[ResultRecord]:
    """The records run p wrote into `out` during this night (created after it started) when every one
    it produces is there and valid: a run that finished but was not stored (the nightly killed, or
    the store unreachable, in between). Empty when any is missing, unreadable or older."""
    found = []
    for rid in p.run.record_ids():
        path = out / f"{rid}.json"
        if not path.is_file() or started_utc is None:
            return []
        try:
            rec = load_record(path)
        except HarnessError:
            return []
        if not rec.created_utc or datetime.fromisoformat(rec.created_utc) < datetime.fromisoformat(started_utc):
            return []
        found.append(rec)
    return found


def run_night(overrides: list[str], *, night: str, repeats: int, store: History, out: Path) -> list[ResultRecord]:
    """Every repeat of the suite; runs the store already holds for this night are skipped, and runs
    written to disk but not stored are stored from their files. A store that fails mid-night stops
    it saying that every record so far is on disk and is stored when the same night runs again."""
    try:
        return _run_night(overrides, night=night, repeats=repeats, store=store, out=out)
    except HarnessError as exc:
        if str(exc).startswith("history store"):
            raise HarnessError(f"{exc}; every record of this night so far is kept under {out}, and running the "
                               f"same night again (--night {night}) stores them without redoing them") from None
        raise


def _run_night(overrides: list[str], *, night: str, repeats: int, store: History, out: Path) -> list[ResultRecord]:
    done: set[tuple[int, str]] = set()
    records = []
    started = None
    for repeat in range(repeats):
        _, planned = plan_suite(overrides + [f"out={out / f'repeat-{repeat}'}"], images=checked_images())
        platform = planned[0].cfg.platform.name
        if repeat == 0:
            store.start_night(night, platform, planned[0].cfg.suite.name, str(out), socket.gethostname())
            done = store.finished(night, platform)
            started = store.night_started(night, platform)
        where = f"[night {night} repeat {repeat + 1}/{repeats}]"
        for p in planned:
            if all((repeat, rid) in done for rid in p.run.record_ids()):
                print(f"{where} {p.run.run_id}: stored, not redone", flush=True)
                continue
            written = written_not_stored(p, out / f"repeat-{repeat}", started)
            if written:
                store.add_runs(night, platform, repeat, [r for r in written if (repeat, r.run_id) not in done])
                records += written
                print(f"{where} {p.run.run_id}: finished before but not stored: stored from its record "
                      f"file(s), not redone", flush=True)
                continue
            if p.run.run_dir.exists():  # interrupted before it was stored: start it afresh
                shutil.rmtree(p.run.run_dir)
            print(where, flush=True)
            new = execute([p], out / f"repeat-{repeat}")
            # all of the run's records, or none (a sweep that an older suite stored in part: the rest)
            store.add_runs(night, platform, repeat, [r for r in new if (repeat, r.run_id) not in done])
            records += new
    return records


def store_url(url: str) -> str:
    """A relative SQLite file is the repository's (its folder made: history.repo_url); any other URL as given."""
    made = repo_url(url, REPO_ROOT)
    if made != url:
        Path(made[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return made


LOOKBACK = 4
"""How far back, in multiples of --baseline-nights, the rolling baseline looks for nights of tonight's machine."""


def machine_nights(earlier: list[tuple[str, ResultRecord]], tonight: list[ResultRecord],
                   count: int) -> tuple[list[str], str]:
    """(the last `count` of the `earlier` nights, (night, record) oldest first, that ran on tonight's machine;
    what was left out, in words). A platform's nightly host may change under one name: a cloud VM of one CPU
    name is a Zen 5 on one night and another EPYC the next (docs/measurement.md, "Which CPU"), 1.4-1.6x apart,
    and a baseline pooling both reads neither. A night's machine is its records' (baseline.machine_key: the
    CPU's ISA class and kind, a GPU node's GPUs); one that agrees but for a kind it did not keep counts as
    tonight's (cross_machine.names_agree); the last `count` of them all where tonight's records name no
    machine."""
    by_night: dict[str, list[ResultRecord]] = {}
    for n, rec in earlier:
        by_night.setdefault(n, []).append(rec)
    candidates, here = sorted(by_night), machine_key(tonight)
    if here is None:
        return candidates[-count:], ""
    theirs = {n: machine_key(recs) for n, recs in by_night.items()}
    same = [n for n in candidates if theirs[n] is None or names_agree(theirs[n], here)][-count:]
    other = [n for n in candidates if n > (same[0] if same else "") and n not in same]
    if not other:
        return same, ""
    machines = sorted({theirs[n] for n in other})
    return same, (f"of this machine, {here}; {len(other)} earlier night{'s' if len(other) != 1 else ''} of "
                  f"{'; '.join(machines)} left out: {', '.join(other)}")


def one_host(store: History, night: str, platform: str) -> None:
    """Stop, before anything runs, when the store holds this platform's night as started on another host: a shared
    store takes several machines' nightlies, and a second machine under the first's night id would resume its night
    (every run the first stored skipped as done) and be judged together with it. A night stored before hosts were
    (the store's schema 0003) is anyone's to resume."""
    started = store.night_host(night, platform)
    here = socket.gethostname()
    if started and started[0] not in (None, here):
        raise HarnessError(
            f"night {night} of platform {platform} in the history store {store.name} was started on host "
            f"{started[0]} (its results in {started[1]}); this is {here}: a night is one machine's runs, resumed "
            f"there and judged as one machine's. Give this machine's night its own id (--night {night}-{here}) or "
            "its own store (--store)")


def judge(store: History, platform: str, night: str, refs: list, baseline_nights: int):
    """(the night's records, {"references"|"baseline": verdicts}, the baseline's nights, their records,
    the references' 'missing' verdicts of configurations the nightly's suite does not run: one line, the
    baseline in words). The baseline's nights are the last ones of tonight's machine (machine_nights) among
    the last LOOKBACK x baseline_nights nights, read from the store once."""
    tonight = [rec for _, rec in store.records(platform, [night])]
    looked = store.records(platform, store.earlier_nights(platform, night, baseline_nights * LOOKBACK))
    earlier_nights, left_out = machine_nights(looked, tonight, baseline_nights)
    earlier = [(n, rec) for n, rec in looked if n in earlier_nights]
    judged, outside = outside_runs(compare(tonight, refs), tonight + [rec for _, rec in earlier])
    verdicts = {"references": judged,
                "baseline": compare(tonight, baseline_references(earlier, platform, earlier_nights, left_out))}
    words = (f"rolling baseline: night{'s' if len(earlier_nights) != 1 else ''} {', '.join(earlier_nights)}"
             if earlier_nights else "rolling baseline: no earlier night") + (f" ({left_out})" if left_out else "")
    return tonight, verdicts, earlier_nights, earlier, outside, words


def first_repeat(store: History, platform: str, night: str, refs: list, verdicts: dict[str, list],
                 earlier: list[tuple[str, ResultRecord]], earlier_nights: list[str], out: Path) -> str:
    """What a one-repeat night would have judged, and what the night's repeats made of it: each run's first repeat
    judged alone against the references and the rolling baseline that judged the night, each regression it read
    against the verdict on all the repeats (confirmation.confirmed: the other repeats are its reruns), kept in the
    store for `python -m harness alarms` (alarms.keep_night); its line, '' for a night of one repeat. A store that
    fails here is a line, never the night's end: its verdicts and reports stand."""
    try:
        by_repeat = store.repeats(platform, night)
    except HarnessError as exc:
        return f"first repeat alone: not judged: {exc}"
    first_of: dict[str, int] = {}
    for repeat, rec in by_repeat:
        first_of.setdefault(rec.run_id, repeat)
    repeats = len({repeat for repeat, _ in by_repeat})
    if repeats < 2:
        return ""
    firsts = [rec for repeat, rec in by_repeat if repeat == first_of[rec.run_id]]
    first = FirstReading(compare(firsts, refs),
                         compare(firsts, baseline_references(earlier, platform, earlier_nights)))
    found = confirmed(first, verdicts["references"] + verdicts["baseline"], [rec for _, rec in by_repeat])
    return keep_night(store, first, found, firsts, out, repeats)


def overview(store: History, refs: list, baseline_nights: int, path: Path) -> Path:
    """One page of every platform's last night in the store, judged as the nightly judged it, with what its first
    repeat read alone and whether one repeat would do on its machine (one_run.night_cell) (harness/report/overview.py);
    a line per platform printed."""
    rows = []
    for platform, night, out_dir, finished in store.last_nights():
        tonight, verdicts, earlier_nights, earlier, _, _ = judge(store, platform, night, refs, baseline_nights)
        rows.append(OverviewRow(platform, night, Path(out_dir), finished, tonight, verdicts,
                                night_straggler_lines(tonight, night, earlier, earlier_nights),
                                night_cell(*store.confirmation_rows(platform), out_dir)))
        print(overview_line(rows[-1]))
    if not rows:
        print(f"history store {store.name} holds no night yet")
    written = write_bytes_atomic(path, overview_page(rows, store.name).encode("utf-8"))
    print(f"overview: {written}")
    return written


NIGHT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What --night may be: a store key and a folder name's part (no '/', no '..' at its start, no spaces)."""


def cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness nightly", description=__doc__.splitlines()[0])
    parser.add_argument("--night", default=date.today().isoformat(), help="night id (default: today)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", default=DEFAULT_URL, help=f"SQLAlchemy URL (default {DEFAULT_URL})")
    parser.add_argument("--baseline-nights", type=int, default=7)
    parser.add_argument("--reference", action="append", metavar="FILE",
                        help="reference table(s) to compare with (default: every reference_results/*.json); "
                             "none: judge against the rolling baseline only")
    parser.add_argument("--fail-on", default="regression,status changed",
                        help="comma list of verdicts that make the exit status 1 (_ for a space), straggler (a rank or node stood "
                             "out as one in a run of the night, or held the others back more each night), or none")
    parser.add_argument("--overview", type=Path, metavar="FILE",
                        help="run nothing: write one HTML page of every platform's last night in the store, with "
                             "its verdicts, to FILE")
    parser.add_argument("overrides", nargs="*")
    # intermixed: `make nightly PLATFORM=cpu ARGS="--store URL out=..."` puts an override before the options
    ns = parser.parse_intermixed_args(args)
    if ns.repeats < 1 or ns.baseline_nights < 1:
        raise HarnessError("--repeats and --baseline-nights must be >= 1")
    if not NIGHT_ID.fullmatch(ns.night):
        raise HarnessError(f"--night {ns.night!r} is invalid: a night id is letters, digits, '.', '_' and '-' (at "
                           "most 64, starting with a letter or digit), e.g. 2026-12-03: it names the night in the "
                           "history store and its folder results/nightly-<platform>-<night>")
    fail_on = parse_fail_on(ns.fail_on, also=("straggler",))
    if ns.reference and "none" in ns.reference and len(ns.reference) > 1:
        raise HarnessError(f"--reference none judges against the baseline alone; it takes no other file: {ns.reference}")
    refs = [] if ns.reference == ["none"] else load_references([Path(p) for p in ns.reference] if ns.reference else None)
    if ns.overview:
        if ns.overrides:
            raise HarnessError(f"--overview runs nothing; it takes no overrides: {ns.overrides}")
        overview(History(store_url(ns.store), remedy="pass --store <another SQLAlchemy URL>"), refs,
                 ns.baseline_nights, ns.overview.resolve())
        return 0
    overrides = list(ns.overrides)
    first = compose(overrides)  # validates before anything runs
    if not any(o.startswith("suite=") for o in overrides):
        overrides.append(f"suite=nightly-{first.platform.name}")
    platform = first.platform.name
    out = Path(first.out).resolve() if first.out else REPO_ROOT / "results" / f"nightly-{platform}-{ns.night}"
    store = History(store_url(ns.store), remedy="pass --store <another SQLAlchemy URL>")  # stops before any run
    one_host(store, ns.night, platform)
    make_folder(out)
    run_night([o for o in overrides if not o.startswith("out=")], night=ns.night, repeats=ns.repeats,
              store=store, out=out)
    tonight, verdicts, earlier_nights, earlier, outside, baseline = judge(store, platform, ns.night, refs,
                                                                          ns.baseline_nights)
    store.finish_night(ns.night, platform)
    previous: dict[str, tuple[str, ResultRecord]] = {}
    for night, rec in earlier:                 # the last earlier night's run of each run id (its first repeat)
        if earlier_nights and night == earlier_nights[-1]:
            previous.setdefault(rec.run_id, (night, rec))
    stood = night_straggler_lines(tonight, ns.night, earlier, earlier_nights)
    alone = first_repeat(store, platform, ns.night, refs, verdicts, earlier, earlier_nights, out)
    paths = write_reports(out, platform=platform, night=ns.night, verdicts=verdicts, records=tonight,
                          history=series(store.records(platform, earlier_nights + [ns.night])), previous=previous,
                          unrun=outside, baseline="\n".join(x for x in (baseline, alone) if x), stragglers=stood,
                          held_back=held_back_series(tonight, ns.night, earlier, earlier_nights))
    failing = {k: [v for v in vs if v.verdict in fail_on] for k, vs in verdicts.items()}
    for kind, vs in verdicts.items():
        counts = json.dumps({v: sum(x.verdict == v for x in vs) for v in VERDICTS if any(x.verdict == v for x in vs)})
        print(f"night {ns.night} vs {kind}: {counts}")
    print(f"  {baseline}")
    if alone:
        print(f"  {alone}")
    if outside:
        print(f"  {unrun_line(outside, OUTSIDE_SUITE)}")
    for kind, vs in failing.items():   # what changed once, under the verdicts that share it
        for _, group in grouped(vs, lambda v: json.dumps(v.environment_diff, sort_keys=True, default=str)):
            for v in group:
                print(f"  {v.verdict} ({kind}): {v.platform}/{v.benchmark} {v.metric}: {verdict_text(v)}")
            if group[0].environment_diff:
                print(f"    what changed: {environment_text(group[0].environment_diff)}")
    for line in stood:
        print(f"  straggler: {line}")
    print("reports: " + ", ".join(str(p) for p in paths.values()))
    return 1 if any(failing.values()) or (stood and "straggler" in fail_on) else 0
