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
    assert got["source"] == "nccl-tests"   # a -J output too: the binary a bench sweep of nccl-tests runs
    verdicts = compare([rec], [])
    assert {v.verdict for v in verdicts} == {"new"}
    # the average busbw, the largest sizes', and the small sizes' time where the sweep has sizes up to 64 KiB
    assert sorted(v.metric for v in verdicts) == (["avg_busbw_gbps", "large_busbw_gbps"]
                                                  + (["small_time_us"] if got["min_bytes"] <= 65536 else []))


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
    assert [(v.metric, v.verdict) for v in verdicts] == [("avg_busbw_gbps", "regression"), ("large_busbw_gbps", "pass"),
                                                             ("small_time_us", "pass")]
    assert unmatched == ""


def test_an_output_cut_to_its_last_rank_line_gets_its_ranks_from_the_bus_factor_and_no_nodes(tmp_path):
    """A GB200 all_reduce pasted from its last Rank line (rank 71 on one host): busbw/algbw 1.972 is 2(n-1)/n at
    72 ranks and no other count; the one host printed is not the run's nodes (the key said nodes=1)."""
    rec = imported(tmp_path, "real_coreweave43_all_reduce.txt")
    assert rec["config"]["num_ranks"] == 72 and rec["config"]["num_ranks_from"] == "busbw/algbw"
    assert rec["environment"]["hosts"] == ["slurm-gb200-207-171"]
    key = record_config(load_records([str(tmp_path / "imported")])[0])
    assert key["num_ranks"] == 72 and key["nodes"] is None


def test_the_bus_factor_names_a_rank_count_only_when_the_rounding_leaves_one():
    from harness.collectives import Placement, Row
    from harness.nccl_tests.infer import ranks_from_ratio

    def rows(algbw: float, busbw: float) -> list:
        placement = Placement(time_us=100.0, algbw_gbps=algbw, busbw_gbps=busbw, num_wrong=0)
        return [Row(1 << 30, 1 << 28, "float", "sum", -1, placement, placement)]

    assert ranks_from_ratio("all_reduce", rows(200.00, 350.00), json=False) == 8        # 1.75 = 2 x 7/8
    assert ranks_from_ratio("all_gather", rows(200.00, 187.50), json=False) == 16       # 0.9375 = 15/16
    assert ranks_from_ratio("all_reduce", rows(2.20, 4.33), json=False) is None         # 1.96-1.98: many counts
    assert ranks_from_ratio("broadcast", rows(200.00, 200.00), json=False) is None      # no n in its factor
    assert ranks_from_ratio("all_reduce", rows(200.00, 350.00), json=False, at_least=9) is None  # rank 8 printed
