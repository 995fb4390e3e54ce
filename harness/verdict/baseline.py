"""A machine's own baseline: what `bench` judges a run against when no reference was taken on its
machine (the shipped references are per machine: harness/verdict/compare.py machine_of).

Every bench (and collect) keeps its records in the history store (harness/verdict/history.py, table
bench_runs), by machine: the GPUs' model and count, else the CPU's model and CPUs, else the host
name. A configuration that no reference of this machine judged (its verdicts all "new" or "not
comparable") is compared with the same configuration in this machine's last BASELINE_RUNS bench
runs, aggregated like a submission (median, samples, the platform's tolerances). The first bench on
a laptop is its baseline; the second is judged against it: one sample on each side passes within
the tolerance and is "insufficient data" beyond it (noise cannot be told from a change); from the
third on the earlier runs' spread enters the bootstrap interval.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from contract.metrics import tolerances_for

from .compare import Verdict, compare, machine_of
from .cross_machine import with_isa, without_kind
from ..errors import HarnessError
from .history import History
from ..record import ResultRecord
from .references import record_config, references_from_records

BASELINE_RUNS = 5
UNJUDGED = ("new", "not comparable")
ACROSS = "across machines"
"""The start of the reason of a verdict judged between two machines that differ (harness/verdict/compare.py)."""
STORE_REMEDY = "set history=<another SQLAlchemy URL>, or history=none to keep no history"


def store_url(history: str, out: Path) -> Optional[str]:
    """The history store of a bench whose output folder is `out` (config key `history`)."""
    if history == "none":
        return None
    if history == "auto":
        return f"sqlite:///{Path(out).resolve().parent / 'history.sqlite'}"
    return history


def machine_key(records: list[ResultRecord]) -> Optional[str]:
    """The machine the records ran on (the first that says), with its probe's ISA class and its CPU's kind on a
    cpu machine (hosts of one cloud VM type share a CPU name with AVX-512 on some and AVX2 on others, and a Zen 5
    on some: each kind its own baseline), else 'host <name>'. A box's benches kept before the CPU's kind was
    (under the key without_kind gives) stay its baseline: judge reads both keys."""
    for rec in records:
        env = rec.environment
        if env.get("machine"):
            name = machine_of(env)
            return with_isa(name, env) if name else f"host {env.get('host') or '?'}"
    return None


def _key(platform: str, benchmark: str, config: dict[str, Any]) -> tuple:
    return platform, benchmark, json.dumps(config, sort_keys=True)


@dataclass
class BaselineResult:
    machine: Optional[str]
    url: Optional[str]
    verdicts: list[Verdict] = field(default_factory=list)
    earlier_runs: int = 0
    first: Optional[str] = None
    unjudged: int = 0
    note: str = ""


def judge(records: list[ResultRecord], verdicts: list[Verdict], history: str, out: Path,
          keep: bool = True) -> BaselineResult:
    """Judge what the references did not against this machine's earlier bench runs, then keep these
    records as its newest run (unless not `keep`: a look before the bench's runs are all in). A store that
    cannot be opened is a note, never a failed bench."""
    url = store_url(history, out)
    machine = machine_key(records)
    result = BaselineResult(machine, url)
    if url is None or machine is None or not records:
        result.note = "history=none: nothing kept" if url is None else ""
        return result
    judged = {_key(v.platform, v.benchmark, v.config) for v in verdicts   # an efficiency judged across machines
              if v.verdict not in UNJUDGED + ("missing",) and not v.reason.startswith(ACROSS)}   # is no judgment of this one
    todo = [r for r in records if _key(r.platform, r.benchmark, record_config(r)) not in judged]
    result.unjudged = len(todo)
    try:
        store = History(url, remedy=STORE_REMEDY)
        platform = records[0].platform
        kept = [(d, rec) for key in dict.fromkeys([machine, without_kind(machine)])   # its benches kept before
                for d, rec in store.bench_records(key, platform, BASELINE_RUNS + 1)     # the CPU's kind: this box's
                if d != str(Path(out).resolve())]                        # a folder collected again is not its own baseline
        kept.sort(key=lambda k: str(k[1].created_utc or ""))   # the two keys' benches, oldest first
        folders = list(dict.fromkeys(d for d, _ in kept))[-BASELINE_RUNS:]
        earlier = [rec for d, rec in kept if d in folders]
        if todo and earlier:
            dates = sorted(str(rec.created_utc or "")[:10] for rec in earlier)
            result.earlier_runs, result.first = len(folders), dates[0] or None
            refs = references_from_records(earlier, source=f"this machine's baseline ({machine})",
                                           submitter="bench", date=dates[-1] or "unknown", system=machine,
                                           tolerance_pct=tolerances_for(platform))
            result.verdicts = [v for v in compare(todo, refs) if v.verdict != "missing"]
        if keep:
            store.add_bench(machine, platform, str(Path(out).resolve()), records)
    except HarnessError as exc:
        result.note = f"history store not used: {str(exc).removeprefix('history store ')}"
    return result


def baseline_text(result: BaselineResult, table: str) -> str:
    """The bench's section on the machine's baseline (printed and in compare.md)."""
    if result.note:
        return result.note
    if result.url is None or not result.unjudged:
        return ""
    where = result.url.removeprefix("sqlite:///")
    if all(v.verdict == "new" for v in result.verdicts):
        return (f"No reference of this machine ({result.machine}) for {result.unjudged} record(s), and no earlier "
                f"bench run of theirs here: they are its baseline now ({where}); the next bench here is judged "
                "against them.")
    return (f"Compared with this machine's earlier bench runs (the last {BASELINE_RUNS} at most: {result.earlier_runs} "
            f"since {result.first}; {result.machine}; {where}), for the {result.unjudged} record(s) no reference "
            f"of this machine judged:\n\n{table}")
