"""The cpu-cluster nightly's kept nights (tests/data/cluster_nights/: 13 quiet, two with the link slowed), read once,
for the tests of the platform's tolerances and references."""
from __future__ import annotations

import collections
import functools
import gzip
import json

from unit_helpers import REPO_ROOT

from harness.record import ResultRecord, collective_record

NIGHTS = REPO_ROOT / "tests" / "data" / "cluster_nights" / "nights.jsonl.gz"


@functools.lru_cache(maxsize=1)
def _kept() -> tuple[tuple[str, dict], ...]:
    rows = (json.loads(line) for line in gzip.decompress(NIGHTS.read_bytes()).decode("utf-8").splitlines())
    return tuple((row["night"], row["record"]) for row in rows)


def nights() -> dict[str, list[ResultRecord]]:
    """{night: its 12 records} as kept (a fresh copy each call: tests may edit them)."""
    out: dict[str, list[ResultRecord]] = collections.defaultdict(list)
    for night, record in _kept():
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
