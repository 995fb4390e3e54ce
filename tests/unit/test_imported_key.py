"""Records imported from saved nccl-tests outputs are compared like any other: found running
`import-nccl-tests alltoall-16gpu.log` then `compare` on its folder, which stopped with a traceback
(KeyError 'platform': the configuration's key read a config group that an imported record lacks)."""
from __future__ import annotations

import copy
import json

import pytest
from unit_helpers import REPO_ROOT

from harness.nccl_tests.importer import import_files
from harness.verdict.ab import against
from harness.verdict.compare import compare, load_records
from harness.verdict.references import record_config

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"


def imported(tmp_path, name: str, folder: str = "imported") -> dict:
    path, = import_files([str(DATA / name)], tmp_path / folder, platform="roce-h100")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name, key", [
    ("new_all_reduce.txt", {"nodes": 1, "num_ranks": 8, "min_bytes": 8, "max_bytes": 1073741824,
                            "dtype": "float32", "redop": "sum", "source": "nccl-tests"}),
    ("alltoall-16gpu.log", {"nodes": 2, "num_ranks": 16, "min_bytes": 1048576, "max_bytes": 1073741824,
                            "dtype": "float32", "redop": "sum", "source": "nccl-tests"}),   # reduces nothing
    ("json_all_reduce_v1.json", None),
])
def test_an_imported_record_has_the_key_of_the_sweep_it_ran(tmp_path, name, key):
    imported(tmp_path, name)
    rec, = load_records([str(tmp_path / "imported")])
    got = record_config(rec)
    if key:
        assert got == key
    assert got["dtype"] == "float32" and got["min_bytes"] <= got["max_bytes"]
    verdicts = compare([rec], [])
    assert [v.verdict for v in verdicts] == ["new"]


def test_an_imported_output_pairs_with_the_same_sweep_run_by_bench(tmp_path):
    """`bench collective.source=nccl-tests` on the cluster, against the output a team saved there earlier."""
    old = imported(tmp_path, "new_all_reduce.txt", "old")
    new = copy.deepcopy(old)
    new["config"] = {"platform": {"nodes": 1}, "nccl_env": {},
                     "collective": {"min_bytes": 8, "max_bytes": 1073741824, "dtype": "float32", "redop": "sum"}}
    new["metrics"]["avg_busbw_gbps"]["value"] *= 0.5
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "bench.json").write_text(json.dumps(new), encoding="utf-8")
    verdicts, unmatched = against([str(tmp_path / "new")], [str(tmp_path / "old")], min_samples=1)
    assert [(v.metric, v.verdict) for v in verdicts] == [("avg_busbw_gbps", "regression")]
    assert unmatched == ""
