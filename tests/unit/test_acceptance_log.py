"""A cluster's acceptance log as its reference (harness/verdict/imported.py): a saved nccl-tests output,
imported, is submitted on what it says (NCCL version, the GPUs its Rank lines name, every row), and a
later run of another -b/-e, imported or the suite's own sweep, is judged against it by size."""
from __future__ import annotations

import json

import pytest
from unit_helpers import REPO_ROOT

from harness.__main__ import main
from harness.verdict.by_size import AVERAGE, SHARED, SHARED_SMALL, SMALL
from harness.verdict.compare import compare, load_records
from harness.verdict.references import load_references
from test_by_size import narrowed_output

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"
H100_RECORD = REPO_ROOT / "reference_results" / "sources" / "gpu-runs" / "2026-11-27-h100" / "gpu-check" / "00-nccl-all_reduce.json"
"""A real gpu-check record of one H100: its machine carries the node's capability probe."""


def imported(tmp_path, name: str, text: str, platform: str = "h100") -> str:
    src = tmp_path / "outputs" / name
    src.parent.mkdir(exist_ok=True)
    src.write_text(text, encoding="utf-8")
    out = tmp_path / f"{src.stem}-records"
    assert main(["import-nccl-tests", str(src), "--out", str(out), "--platform", platform, "--op", "all_reduce"]) == 0
    return str(out)


@pytest.fixture
def acceptance(tmp_path):
    """The acceptance log (-b 8 -e 1G -f 4 on 8 H100s) imported, and tonight's run (-b 2K -e 128M) at half
    the busbw from 8 MiB on."""
    log = imported(tmp_path, "all_reduce_perf.txt", (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"))
    tonight = imported(tmp_path, "tonight.txt", narrowed_output(2048, 134217728, slow_from=8388608, slow=0.5))
    return log, tonight, tmp_path / "h100.json"


def submit(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["submit", *args, "--submitter", "ops team"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_import_names_the_node_its_rank_lines_show(acceptance):
    (rec,) = load_records([acceptance[0]])
    assert rec.environment["machine"]["gpus"] == [{"name": "NVIDIA H100 80GB HBM3"}] * 8
    assert rec.environment["nccl"] == "2.18.5"


def test_an_acceptance_log_becomes_the_reference_and_tonights_range_is_judged_by_size(acceptance, capsys):
    log, tonight, table = acceptance
    rc, _, err = submit(capsys, log, "--reference-file", str(table))
    assert rc == 2 and "at least 3 needed" in err and "submitted with --min-repeats 1" in err
    assert not table.exists()   # nothing written
    rc, out, _ = submit(capsys, log, "--reference-file", str(table), "--min-repeats", "1")
    assert rc == 0, out
    refs = load_references([table])
    assert sorted(r.metric for r in refs) == [AVERAGE, "large_busbw_gbps", SHARED, SHARED_SMALL, SMALL]
    (shared,) = [r for r in refs if r.metric == SHARED]
    assert shared.provenance.source == "imported nccl-tests output"
    assert shared.provenance.system == ("8 x NVIDIA H100 80GB HBM3 on h100-node-01, NCCL 2.18.5: "
                                        "nccl-tests output all_reduce_perf.txt")
    assert shared.provenance.suite_commit is None and len(shared.by_size[0]) == 14
    rc = main(["compare", tonight, "--reference", str(table), "--min-samples", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "regression" in out and "over the 9 sizes (2K-128M) both ran" in out
    assert "no result among these runs" not in out   # the acceptance log's own range is not 'missing'


def test_a_second_range_joins_the_by_size_reference_and_a_repeat_is_refused(acceptance, capsys):
    log, tonight, table = acceptance
    assert submit(capsys, log, "--reference-file", str(table), "--min-repeats", "1")[0] == 0
    rc, out, _ = submit(capsys, tonight, "--reference-file", str(table), "--min-repeats", "1")
    rows = [line.split() for line in out.splitlines()]
    assert rc == 0 and ["added", "c1", "avg_busbw_gbps"] in [r[:3] for r in rows], out   # the new range's own
    assert ["pooled", "into", "c2"] in [r[:3] for r in rows] and "h100/all_reduce" in out, out   # the by-size one
    (shared,) = [r for r in load_references([table]) if r.metric == SHARED]
    assert shared.num_samples == 2 and "with median of 1 runs; runs: nccl-tests-tonight" in shared.provenance.note
    before = table.read_text(encoding="utf-8")
    rc, _, err = submit(capsys, tonight, "--reference-file", str(table), "--min-repeats", "1")
    assert rc == 2 and "already has" in err and table.read_text(encoding="utf-8") == before


def test_an_output_that_cannot_name_its_machine_or_of_other_gpus_is_refused(tmp_path, capsys):
    tail = imported(tmp_path, "all_reduce.txt", (DATA / "real_coreweave43_all_reduce.txt").read_text(encoding="utf-8"),
                    platform="h100")
    rc, _, err = submit(capsys, tail, "--reference-file", str(tmp_path / "t.json"), "--min-repeats", "1")
    assert rc == 2 and "the output does not name one GPU model on every rank" in err
    h100 = imported(tmp_path, "all_reduce_perf.txt", (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"),
                    platform="h200")
    rc, _, err = submit(capsys, h100, "--reference-file", str(tmp_path / "t.json"), "--min-repeats", "1")
    assert rc == 2 and "hardware: platform h200 declares H200-SXM-141GB (bf16 peak" in err
    assert "the ranks ran on 'NVIDIA H100 80GB HBM3'; a record of other hardware than its platform declares" in err
    assert not (tmp_path / "t.json").exists()


def test_a_json_output_names_its_nodes_from_each_processs_device(tmp_path, capsys):
    """-J: one device entry per process (2 processes of 4 GPUs on node-a and node-b): 4 x H100 a node."""
    out = tmp_path / "json"
    assert main(["import-nccl-tests", str(DATA / "json_all_reduce_v1.json"), "--out", str(out),
                 "--platform", "h100"]) == 0
    (rec,) = load_records([str(out)])
    assert rec.environment["machine"]["gpus"] == [{"name": "NVIDIA H100 80GB HBM3"}] * 4
    rc, _, err = submit(capsys, str(out), "--reference-file", str(tmp_path / "t.json"), "--min-repeats", "1")
    assert rc == 0, err
    (shared,) = [r for r in load_references([tmp_path / "t.json"]) if r.metric == SHARED]
    assert shared.provenance.system.startswith("4 x NVIDIA H100 80GB HBM3 on node-a, node-b, NCCL ")


def test_outputs_and_the_suites_records_are_submitted_apart(acceptance, capsys):
    rc, _, err = submit(capsys, acceptance[0], str(H100_RECORD), "--reference-file", str(acceptance[2]),
                        "--min-repeats", "1")
    assert rc == 2 and "submit each kind on its own" in err


@pytest.mark.parametrize("gpus, judged", [(8, True), (4, False)])
def test_the_suites_sweep_with_a_probe_is_judged_by_the_machine_the_log_names(acceptance, capsys, gpus, judged):
    """A bench sweep carries the node's probe and the acceptance log none: of the same name (8 x H100) it is
    judged, the verdict saying how; of another, not comparable."""
    log, tonight, table = acceptance
    assert submit(capsys, log, "--reference-file", str(table), "--min-repeats", "1")[0] == 0
    (rec,) = load_records([tonight])
    machine = json.loads(H100_RECORD.read_text(encoding="utf-8"))["environment"]["machine"]
    rec.environment["machine"] = {**machine, "gpus": machine["gpus"] * gpus}
    rec.environment.update(python="3.12.3", torch="2.11.0+cu130", suite_commit="abc", host="node", world_size=8)
    v, small = compare([rec], load_references([table]), min_samples=1)   # busbw, and the small sizes' time
    assert (v.metric, small.metric) == (SHARED, SHARED_SMALL) and small.verdict == ("pass" if judged else v.verdict)
    if judged:
        assert v.verdict == "regression"
        assert "the reference names its machine only (8 x NVIDIA H100 80GB HBM3, a saved output's; no probe)" in v.reason
        # what the output never printed (the CPU, Python, the suite) is not named as a change
        assert not any(then is None for then, _ in v.environment_diff.values()), v.environment_diff
    else:
        assert v.verdict == "not comparable" and "machine not measured" in v.reason


def test_an_output_under_a_platform_without_gpus_is_refused(tmp_path, capsys):
    out = imported(tmp_path, "all_reduce_perf.txt", (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"),
                   platform="cpu")
    rc, _, err = submit(capsys, out, "--reference-file", str(tmp_path / "t.json"), "--min-repeats", "1")
    assert rc == 2 and "platform 'cpu' declares no GPU: an nccl-tests output is a GPU platform's" in err


def test_a_table_whose_by_size_runs_are_not_sizes_is_refused_by_name(acceptance, capsys):
    log, tonight, table = acceptance
    assert submit(capsys, log, "--reference-file", str(table), "--min-repeats", "1")[0] == 0
    data = json.loads(table.read_text(encoding="utf-8"))
    shared = next(e for e in data["references"] if e["metric"] == SHARED)
    shared["by_size"][0]["64K"] = 1.0
    table.write_text(json.dumps(data), encoding="utf-8")
    rc = main(["compare", tonight, "--reference", str(table)])
    err = capsys.readouterr()
    assert rc == 2 and "'64K' does not match '^[0-9]+$'" in err.out + err.err
