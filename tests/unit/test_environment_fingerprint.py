"""The environment fingerprint's three builders (the ranks, the controller, an imported nccl-tests
output) hold exactly the fields contract/fingerprint.py declares for each, in its order; the
declared views are pinned here as records hold them today."""
from __future__ import annotations

import pytest
from unit_helpers import REPO_ROOT

from benchmarks.node.environment import fingerprint
from contract.fingerprint import CONTROLLER_FIELDS, IMPORTED_FIELDS, RANK_FIELDS
from harness.nccl_tests.importer import records_from_output
from harness.nccl_tests.json_format import parse_file
from harness.record import controller_environment

RANK = ["python", "torch", "deepspeed", "transformers", "datasets", "triton", "liger_kernel", "torchao", "cuda", "nccl",
        "driver", "gpu_model", "gpu_count", "cpu_model", "machine", "os", "container_image", "container_digest",
        "container_runtime", "lock_mismatches", "env", "host", "world_size"]
CONTROLLER = ["python", "torch", "deepspeed", "transformers", "datasets", "triton", "liger_kernel", "torchao", "cuda",
              "nccl", "driver", "gpu_model", "gpu_count", "container_image", "container_digest", "env", "host"]
IMPORTED = ["python", "torch", "deepspeed", "transformers", "cuda", "nccl", "driver", "gpu_model", "gpu_count", "machine",
            "container_image", "env", "hosts", "suite_commit", "nccl_tests", "num_ranks"]


def test_the_declared_views_are_what_records_hold():
    assert (list(RANK_FIELDS), list(CONTROLLER_FIELDS), list(IMPORTED_FIELDS)) == (RANK, CONTROLLER, IMPORTED)


def test_the_controller_builds_its_declared_fields_without_torch():
    env = controller_environment()
    assert list(env) == list(CONTROLLER_FIELDS)
    assert env["gpu_count"] == 0 and env["env"] == {} and env["cuda"] is None and env["python"]


@pytest.mark.parametrize("name", ["new_all_reduce.txt", "json_all_reduce_v1.json", "old_broadcast_2proc.txt"])
def test_an_imported_nccl_tests_output_builds_its_declared_fields(name):
    parsed = parse_file(REPO_ROOT / "tests" / "data" / "nccl_tests" / name)
    env = records_from_output(parsed, run_id="r", platform="h100", source_file=name).environment
    assert list(env) == list(IMPORTED_FIELDS)
    assert env["python"] is None and env["suite_commit"] is None and env["num_ranks"] == parsed.num_ranks


def test_a_rank_builds_its_declared_fields():
    pytest.importorskip("torch")
    env = fingerprint(3)
    assert list(env) == list(RANK_FIELDS)
    assert env["world_size"] == 3 and env["cpu_model"] == env["machine"]["cpu"]["model"]
