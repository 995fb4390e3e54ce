"""The cpu-cluster nightly's kept nights (tests/data/cluster_nights/: 13 quiet, two with the link slowed; and the
nights beside a neighbour), read once, for the tests of the platform's tolerances, references and load."""
from __future__ import annotations

import collections
import functools
import gzip
import json

from unit_helpers import REPO_ROOT

from harness.record import ResultRecord, collective_record
from harness.verdict.references import references_from_records

KEPT = REPO_ROOT / "tests" / "data" / "cluster_nights"
NIGHTS = KEPT / "nights.jsonl.gz"
NEIGHBOUR = KEPT / "neighbour.jsonl.gz"


@functools.lru_cache(maxsize=2)
def _kept(path: str) -> tuple[tuple[str, dict], ...]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return tuple((row["night"], row["record"]) for row in map(json.loads, f))


def nights(path=NIGHTS) -> dict[str, list[ResultRecord]]:
    """{night: its 12 records} as kept in `path` (a fresh copy each call: tests may edit them)."""
    out: dict[str, list[ResultRecord]] = collections.defaultdict(list)
    for night, record in _kept(str(path)):
        out[night].append(ResultRecord.from_dict(json.loads(json.dumps(record))))
    return dict(out)


def rederived(rec: ResultRecord) -> ResultRecord:
    """A kept sweep's record made again from its rows by today's code: its metrics as a sweep records them now
    (large_busbw_gbps came after these nights; a metric is a function of the rows)."""
    if rec.kind != "collective":
        return rec
    return collective_record(run_id=rec.run_id, name=rec.name, benchmark=rec.benchmark, platform=rec.platform,
                             status=rec.status, reason=rec.reason, rows=rec.rows, config=rec.config,
                             overrides=rec.overrides, environment=rec.environment, complete=rec.complete,
                             source=rec.source, wall_s=rec.wall_s, one_host=False)


def night_references(records: list[ResultRecord], tolerance: dict[str, float]):
    """References made of one night's (or several nights') records at `tolerance`, as a submission of them would be."""
    return references_from_records(records, source="a night", submitter="test", date="2026-12-05",
                                   system="cpu-cluster", tolerance_pct=tolerance)
