"""A/B without a reference table: `python -m harness compare NEW... --against OLD...`.

The OLD records become references on the spot (references.references_from_records: one per
platform, benchmark, configuration and metric, the median as value and every OLD run's value as
samples, so the bootstrap interval resamples both sides; tolerances per platform from
references.tolerances_for; the first OLD run's fingerprint, so a regression names what changed).
An OLD configuration none of whose runs ended ok becomes a status reference (value none), so
oom -> ok reads "status changed" as against a reference table. Then harness.verdict.compare judges NEW
exactly as against a table: a NEW configuration pairs with OLD's of its own platform, else with OLD's
of the same configuration on another platform (another machine: compare.pairing); NEW without an OLD
counterpart is "new"; OLD without a NEW counterpart is one line (`unmatched_line`), not a row per metric.
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import date

from contract.metrics import tolerances_for

from .by_size import BY_SIZE, sizeless
from .compare import Group, compare, group_records, load_records, pairing
from ..errors import HarnessError
from ..record import ResultRecord
from .references import REFERENCE_METRICS, Provenance, Reference, references_from_records
from ..report.verdicts import config_label, distinguishing_keys

SOURCE = "compare --against"


def load_side(paths: list[str], side: str) -> list[ResultRecord]:
    """The records of one side ('NEW' or '--against'), or an error naming the side and the path."""
    try:
        return load_records(paths)
    except HarnessError as exc:
        raise HarnessError(f"{side}: {exc}") from None


def references_of(old: list[ResultRecord]) -> list[Reference]:
    """The OLD records as references: each platform with its own tolerances."""
    today = date.today().isoformat()
    refs: list[Reference] = []
    for platform in sorted({r.platform for r in old}):
        mine = [r for r in old if r.platform == platform]
        system = f"the --against records of {platform}"
        refs += references_from_records(mine, source=SOURCE, submitter=SOURCE, date=today, system=system,
                                        tolerance_pct=tolerances_for(platform))
        refs += [ref for g in group_records(mine) if not any(r.status == "ok" for r in g.records)
                 for ref in status_references(g, today, system)]
    return refs


def status_references(g: Group, today: str, system: str) -> list[Reference]:
    """An OLD configuration that never ended ok (oom, error, ...): its status, one per metric."""
    status = "/".join(sorted({r.status for r in g.records}))
    tolerance = tolerances_for(g.platform)
    env = g.records[0].environment
    return [Reference(g.platform, g.benchmark, g.config, metric, None, "", direction,
                      tolerance.get(metric, tolerance["default"]), status,
                      provenance=Provenance(SOURCE, SOURCE, today, system, env, env.get("suite_commit"),
                                            note="runs: " + ", ".join(r.run_id for r in g.records)))
            for metric, direction in REFERENCE_METRICS.get(g.kind, {}).items() if metric not in BY_SIZE]   # by size: no status


def unmatched(old: list[ResultRecord], new: list[ResultRecord]) -> list[Group]:
    """OLD configurations that no NEW result is paired with (harness.verdict.compare.pairing: its own
    platform's first, else another platform's of the same configuration)."""
    groups = group_records(old)
    stand_ins = [Reference(g.platform, g.benchmark, config, "", None, "", "higher", 0.0) for g in groups
                 for config in ((g.config, sizeless(g.config)) if g.kind == "collective" else (g.config,))]
    paired = {_key(r.platform, r.benchmark, r.config) for n in group_records(new)
              for side in pairing(stand_ins, n) for r in side}   # a collective: its range's, else by size
    return [g for g in groups if _key(g.platform, g.benchmark, g.config) not in paired
            and not (g.kind == "collective" and _key(g.platform, g.benchmark, sizeless(g.config)) in paired)]


def _key(platform: str, benchmark: str, config: dict) -> tuple:
    return platform, benchmark, json.dumps(config, sort_keys=True)


def unmatched_line(groups: list[Group]) -> str:
    """'3 results of --against with no counterpart in NEW: cpu/llama-tiny ZeRO-3 mb 4 x ga 1 seq 128 (2 runs), ...'."""
    if not groups:
        return ""
    varying, _ = distinguishing_keys([g.config for g in groups])
    labels = Counter()
    for g in groups:
        labels[f"{g.platform}/{g.benchmark} {config_label(g.config, varying)}".strip()] += len(g.records)
    n = sum(labels.values())
    return (f"{n} result{'s' if n != 1 else ''} of --against with no counterpart in NEW: "
            + ", ".join(f"{label} ({k} run{'s' if k != 1 else ''})" for label, k in labels.items()))


def against(new_paths: list[str], old_paths: list[str], min_samples: int = 2) -> tuple[list, str]:
    """(verdicts of NEW against OLD, the line on OLD results NEW has no counterpart for)."""
    new, old = load_side(new_paths, "NEW"), load_side(old_paths, "--against")
    verdicts = [v for v in compare(new, references_of(old), min_samples) if v.run_ids or v.verdict != "missing"]
    return verdicts, unmatched_line(unmatched(old, new))

