"""The contract both sides import (contract/): one collective vocabulary that the config's checks,
nccl-tests' argv and parsing, and the ranks' torch mappings all follow."""
from __future__ import annotations

import pytest

from contract import collectives as vocab
from contract import fingerprint as fp
from harness.nccl_tests import infer as nccl_tests_infer
from harness.config import validate
from harness.errors import ConfigError, HarnessError
from harness.nccl_tests.command import command


def test_the_ranks_map_every_op_dtype_and_reduction_of_the_vocabulary_onto_torch():
    ranks = pytest.importorskip("benchmarks.comm.collectives")
    assert list(ranks.DTYPES) == list(vocab.DTYPES)
    assert set(ranks.REDOPS) == set(vocab.REDOPS)
    assert all(ranks.NCCL_TYPE_NAMES[d] == vocab.NCCL_TYPES[d] for d in vocab.DTYPES)


def test_every_op_has_a_binary_and_every_dtype_a_size_and_an_nccl_name():
    assert set(vocab.BINARIES) == set(vocab.OPS)
    assert all(d in vocab.DTYPE_BYTES and d in vocab.NCCL_TYPES for d in vocab.DTYPES)
    assert all(nccl_tests_infer.op_of_binary(f"/opt/nccl-tests/{b}") == op for op, b in vocab.BINARIES.items())


def test_the_config_and_the_nccl_tests_argv_refuse_what_the_vocabulary_lacks(composed):
    for redop in vocab.REDOPS:
        assert command("all_reduce_perf", min_bytes=8, max_bytes=64, redop=redop)[-1] == redop
    with pytest.raises(HarnessError, match="redop='mean' is invalid; valid: sum, prod, max, min, avg"):
        command("all_reduce_perf", min_bytes=8, max_bytes=64, redop="mean")
    with pytest.raises(ConfigError, match="collective.dtype"):
        validate.validate_collective(composed(["kind=collective", "collective.dtype=complex64"]))


def test_every_metric_a_record_or_a_reference_holds_is_registered_with_its_unit_and_direction():
    import json
    from pathlib import Path

    from contract.metrics import METRICS

    repo = Path(__file__).resolve().parents[2]
    golden = repo / "tests" / "data" / "golden" / "default_suite"
    seen = 0
    for path in golden.glob("*.json"):
        for name, m in json.loads(path.read_text())["metrics"].items():
            assert name in METRICS, f"{path.name}: {name} is not in contract/metrics.py"
            assert m["unit"] == METRICS[name].unit, (path.name, name)
            seen += 1
    assert seen > 50
    for path in (repo / "reference_results").glob("*.json"):
        for ref in json.loads(path.read_text())["references"]:
            m = METRICS[ref["metric"]]
            assert (ref["unit"], ref["direction"]) == (m.unit, m.direction), (path.name, ref["metric"])


def test_portability_takes_a_direction_from_the_registry_and_refuses_an_unknown_metric():
    from harness.verdict.portability import direction_of

    assert direction_of("step_time_s", []) == "lower" and direction_of("avg_busbw_gbps", []) == "higher"
    with pytest.raises(HarnessError, match="'joules_per_token' is not registered"):
        direction_of("joules_per_token", [])


def test_the_fingerprint_builder_keeps_one_order_fills_none_and_refuses_what_a_view_lacks():
    for view in (fp.RANK_FIELDS, fp.CONTROLLER_FIELDS, fp.IMPORTED_FIELDS):   # each view is declared in the one order a fingerprint holds
        assert list(view) == [k for k in fp.FIELDS if k in view]
        assert list(fp.build(view)) == list(view) and set(fp.build(view).values()) == {None}
    assert list(fp.build(("host", "python"), host="h")) == ["python", "host"]
    assert fp.build(fp.CONTROLLER_FIELDS, gpu_count=0)["gpu_count"] == 0
    with pytest.raises(ValueError, match="facts outside this fingerprint's fields: world_size"):
        fp.build(fp.CONTROLLER_FIELDS, world_size=2)
    with pytest.raises(ValueError, match="not fingerprint fields: colour"):
        fp.build(("python", "colour"))
    assert set(fp.REQUIRED) <= set(fp.FIELDS) and set(fp.REQUIRED_CUDA) <= set(fp.RANK_FIELDS)
