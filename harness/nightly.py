"""The nightly regression job: `make nightly PLATFORM=<name>` = `python -m harness nightly`.

    python -m harness nightly [--night ID] [--repeats N] [--store URL] [--baseline-nights N]
                              [--reference FILE|none ...] [--fail-on VERDICTS] [overrides ...]

Runs the nightly suite (`suite=nightly-<platform>` unless overridden) `--repeats` times, keeps
every run in the history store (SQLite by default, any SQLAlchemy URL), compares this night's
runs with the reference table and with a rolling baseline (the runs of the last
`--baseline-nights` finished nights; `--reference` picks the reference tables, default every
reference_results/*.json, `none` for the baseline alone), and writes nightly.md, nightly.html (self-contained, with a
trend plot per metric and the micro-step charts) and junit.xml into OUT. A night is identified by
`--night` (default: today's date); running the same night again resumes it: runs already stored
are not redone. Exit status 1 when a comparison finds a verdict in --fail-on (default:
regression, status changed).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
from datetime import date
from pathlib import Path

from contract.metrics import tolerances_for

from .bench import checked_images, execute, plan_suite
from .compare import VERDICTS, compare, parse_fail_on
from .config.compose import compose
from .config.schema import REPO_ROOT
from .errors import HarnessError
from .history import DEFAULT_URL, History
from .record import ResultRecord
from .references import REFERENCE_METRICS, load_references, record_config, references_from_records
from .report.legend import grouped
from .report.nightly import write_reports
from .report.verdicts import verdict_text


def baseline_references(earlier: list[tuple[str, ResultRecord]], platform: str, nights: list[str]):
    """The rolling baseline: earlier nights' runs aggregated like a submission (median, samples);
    its fingerprint is the last good night's, so a regression shows what changed since then."""
    records = [rec for _, rec in earlier]
    return references_from_records(list(reversed(records)), source=f"rolling baseline: nights {', '.join(nights)}",
                                   submitter="nightly", date=nights[-1][:10] if nights else "1970-01-01",
                                   system=platform, tolerance_pct=tolerances_for(platform)) if records else []


def series(history: list[tuple[str, ResultRecord]]) -> dict[str, list[tuple[str, float]]]:
    """Per (benchmark, configuration, metric): the median over each night's repeats, oldest first."""
    values: dict[str, dict[str, list[float]]] = {}
    for night, rec in history:
        if rec.status != "ok":
            continue
        cfg = record_config(rec)
        label = ",".join(f"{k}={v}" for k, v in cfg.items() if k in ("zero_stage", "micro_batch_size",
                                                                       "grad_acc_steps", "max_bytes"))
        for metric in REFERENCE_METRICS.get(rec.kind, {}):
            if metric in rec.metrics:
                name = f"{rec.platform}/{rec.benchmark} {label} {metric}"
                values.setdefault(name, {}).setdefault(night, []).append(rec.metrics[metric]["value"])
    return {name: [(night, statistics.median(v)) for night, v in sorted(nights.items())]
            for name, nights in sorted(values.items())}


def run_night(overrides: list[str], *, night: str, repeats: int, store: History, out: Path) -> list[ResultRecord]:
    """Every repeat of the suite; runs the store already holds for this night are skipped."""
    done: set[tuple[int, str]] = set()
    records = []
    for repeat in range(repeats):
        _, planned = plan_suite(overrides + [f"out={out / f'repeat-{repeat}'}"], images=checked_images())
        platform = planned[0].cfg.platform.name
        if repeat == 0:
            store.start_night(night, platform, planned[0].cfg.suite.name, str(out))
            done = store.finished(night, platform)
        for p in planned:
            if any((repeat, rid) in done for rid in p.run.record_ids()):
                print(f"[night {night} repeat {repeat + 1}/{repeats}] {p.run.run_id}: stored, not redone", flush=True)
                continue
            if p.run.run_dir.exists():  # interrupted before it was stored: start it afresh
                shutil.rmtree(p.run.run_dir)
            print(f"[night {night} repeat {repeat + 1}/{repeats}]", flush=True)
            for record in execute([p], out / f"repeat-{repeat}"):
                store.add_run(night, platform, repeat, record)
                records.append(record)
    return records


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
                        help="comma list of verdicts that make the exit status 1 (_ for a space), or none")
    parser.add_argument("overrides", nargs="*")
    ns = parser.parse_args(args)
    if ns.repeats < 1 or ns.baseline_nights < 1:
        raise HarnessError("--repeats and --baseline-nights must be >= 1")
    fail_on = parse_fail_on(ns.fail_on)
    if ns.reference and "none" in ns.reference and len(ns.reference) > 1:
        raise HarnessError(f"--reference none judges against the baseline alone; it takes no other file: {ns.reference}")
    refs = [] if ns.reference == ["none"] else load_references([Path(p) for p in ns.reference] if ns.reference else None)
    overrides = list(ns.overrides)
    first = compose(overrides)  # validates before anything runs
    if not any(o.startswith("suite=") for o in overrides):
        overrides.append(f"suite=nightly-{first.platform.name}")
    platform = first.platform.name
    out = Path(first.out).resolve() if first.out else REPO_ROOT / "results" / f"nightly-{platform}-{ns.night}"
    url = ns.store
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        (REPO_ROOT / url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{REPO_ROOT / url[len('sqlite:///'):]}"
    store = History(url, remedy="pass --store <another SQLAlchemy URL>")  # stops before any run
    run_night([o for o in overrides if not o.startswith("out=")], night=ns.night, repeats=ns.repeats,
              store=store, out=out)
    tonight = [rec for _, rec in store.records(platform, [ns.night])]
    earlier_nights = store.earlier_nights(platform, ns.night, ns.baseline_nights)
    earlier = store.records(platform, earlier_nights)
    verdicts = {"references": compare(tonight, refs),
                "baseline": compare(tonight, baseline_references(earlier, platform, earlier_nights))}
    store.finish_night(ns.night, platform)
    paths = write_reports(out, platform=platform, night=ns.night, verdicts=verdicts, records=tonight,
                          history=series(store.records(platform, earlier_nights + [ns.night])))
    failing = {k: [v for v in vs if v.verdict in fail_on] for k, vs in verdicts.items()}
    for kind, vs in verdicts.items():
        counts = json.dumps({v: sum(x.verdict == v for x in vs) for v in VERDICTS if any(x.verdict == v for x in vs)})
        print(f"night {ns.night} vs {kind}: {counts}")
    for kind, vs in failing.items():   # what changed once, under the verdicts that share it
        for _, group in grouped(vs, lambda v: json.dumps(v.environment_diff, sort_keys=True, default=str)):
            for v in group:
                print(f"  {v.verdict} ({kind}): {v.platform}/{v.benchmark} {v.metric}: {verdict_text(v)}")
            if group[0].environment_diff:
                print(f"    what changed: {group[0].environment_diff}")
    print("reports: " + ", ".join(str(p) for p in paths.values()))
    return 1 if any(failing.values()) else 0
