"""Importing nccl-tests outputs as printed (harness.nccl_tests.importer, harness.nccl_tests.infer): the record's
avg_busbw_gbps is nccl-tests' own footer figure, and an output that names no binary (most outputs
posted in issues) gets its collective from the file name or its table, or is refused when that is
ambiguous or contradicts the op given. Inputs: tests/data/nccl_tests/ (README.md there)."""
from __future__ import annotations

import json
import statistics

import pytest
from unit_helpers import REPO_ROOT

from harness.errors import HarnessError
from harness.nccl_tests.importer import cli, import_files, records_from_output
from harness.nccl_tests.infer import op_of_file_name
from harness.nccl_tests.json_format import parse_file
from harness.record import validate_record

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"


def rows_mean(p) -> float:
    return statistics.fmean(pl.busbw_gbps for r in p.rows for pl in (r.out_of_place, r.in_place))


def record(path, op=None):
    p = parse_file(path, op=op)
    rec = records_from_output(p, run_id="r", platform="h100", source_file=str(path))
    assert validate_record(rec.to_dict()) == []
    return p, rec


# --- avg_busbw_gbps: the footer's figure ----------------------------------------------------------

# file, op argument, footer as printed, mean of the rounded rows (what the record used to say)
FOOTERS = [("real_issue78_all_reduce.txt", "all_reduce", 4.32178, 4.325),
           ("unnamed_2node_8gpu.txt", None, 9.73768, 9.73833),
           ("unnamed_table_2proc.txt", None, 9.16643, 9.16667),
           ("json_all_reduce_v1.json", None, 24.037899, None)]


@pytest.mark.parametrize("name, op_arg, footer, mean", FOOTERS, ids=lambda v: str(v))
def test_the_record_takes_the_footer_value_exactly(name, op_arg, footer, mean):
    p, rec = record(DATA / name, op_arg)
    assert p.avg_busbw_gbps == footer and rec.metrics["avg_busbw_gbps"]["value"] == footer
    assert rec.metrics["avg_busbw_gbps"]["source"] == "nccl-tests footer" and rec.status == "ok"
    if mean is not None:  # the rounded rows' mean differs: the footer averages the unrounded busbw
        assert round(rows_mean(p), 5) == mean != footer


def test_the_imported_record_file_carries_the_footer_value(tmp_path):
    (path,) = import_files([str(DATA / "real_issue78_all_reduce.txt")], tmp_path, "v100", op="all_reduce")
    assert json.loads(path.read_text())["metrics"]["avg_busbw_gbps"]["value"] == 4.32178


@pytest.mark.parametrize("name", ["cut_before_footer.txt", "cut_mid_row.txt", "json_all_reduce_v1_cut.json",
                                  "json_all_gather_v2_failed.json"])
def test_without_a_footer_the_rows_mean_is_used_and_the_record_says_so(name):
    p, rec = record(DATA / name)
    assert p.avg_busbw_gbps is None and p.rows
    m = rec.metrics["avg_busbw_gbps"]
    assert m["value"] == pytest.approx(rows_mean(p), rel=1e-12)
    assert m["source"] == "mean of the printed rows (no footer)"
    assert rec.status == "error" and rec.complete is False
    assert "cut short" in rec.reason and 'no "Avg bus bandwidth" footer: avg_busbw_gbps is the mean' in rec.reason


def test_a_footer_leaves_nothing_to_say_in_the_reason():
    _, rec = record(DATA / "new_reduce_wrong.txt")  # an error record for its wrong values, footer present
    assert "footer" not in rec.reason and rec.metrics["avg_busbw_gbps"]["value"] == 180.189


# --- the op from the file name --------------------------------------------------------------------

@pytest.mark.parametrize("name, op", [
    ("all_reduce_perf.txt", "all_reduce"), ("allreduce.log", "all_reduce"), ("AllReduce-64gpu.txt", "all_reduce"),
    ("reduce_scatter-8gpu.out", "reduce_scatter"), ("ReduceScatter.txt", "reduce_scatter"),
    ("alltoall", "all_to_all"), ("all_to_all_2node.log", "all_to_all"), ("sendrecv", "sendrecv"),
    ("send_recv.txt", "sendrecv"), ("nccl_reduce.txt", "reduce"), ("bcast.txt", None),
    ("broadcast.log", "broadcast"),
    ("allgather.txt", "all_gather"), ("allreduce_vs_allgather.txt", None), ("results.txt", None),
    ("gather_perf.txt", None), ("myreduce.txt", None), ("/runs/allreduce/out.txt", None),
])
def test_file_name_names_at_most_one_op(name, op):
    assert op_of_file_name(name) == op


@pytest.mark.parametrize("name, op", [("all_gather_perf.txt", "all_gather"), ("AllGather.log", "all_gather"),
                                      ("alltoall", "all_to_all"), ("all_to_all-8gpu.out", "all_to_all")])
def test_op_inferred_from_the_file_name_when_the_table_is_ambiguous(tmp_path, name, op):
    path = tmp_path / name  # all_gather's table: all_gather and all_to_all print alike
    path.write_text((DATA / "unnamed_1node_8gpu.txt").read_text())
    p, rec = record(path)
    assert p.op == op and rec.benchmark == op
    assert rec.config["op_inferred"] == (f"inferred from the file name {name!r}; the table agrees "
                                         "(redop none, root -1, busbw/algbw 0.875, 8 ranks)")


def test_the_cli_prints_and_records_how_the_op_was_inferred(tmp_path, capsys):
    out = tmp_path / "rec"
    assert cli([str(DATA / "alltoall-16gpu.log"), str(DATA / "unnamed_2node_8gpu.txt"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("all_to_all, 6 rows, ok; op all_to_all inferred from the file name "
                               "'alltoall-16gpu.log'; the table agrees (redop none, root -1, busbw/algbw 0.9374, "
                               "16 ranks)")
    assert printed[1].endswith("all_reduce, 6 rows, ok; op all_reduce inferred from the table (redop sum, "
                               "root -1, busbw/algbw 1.75, 8 ranks): only all_reduce fits")
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert [r["config"]["op_inferred"].split(" (")[0].split(" '")[0] for r in recs] == [
        "inferred from the file name", "inferred from the table"]


def test_an_output_naming_its_binary_records_no_inference():
    _, rec = record(DATA / "new_all_reduce.txt")
    assert rec.config["op_inferred"] is None


# --- the op from the table ------------------------------------------------------------------------

def _without(text: str, marker: str) -> str:
    return "\n".join(ln for ln in text.split("\n") if marker not in ln)


@pytest.mark.parametrize("name, edit, op, table", [
    ("unnamed_2node_8gpu.txt", None, "all_reduce", "redop sum, root -1, busbw/algbw 1.75, 8 ranks"),
    # the same rows without the Rank lines: only all_reduce's factor 2(n-1)/n exceeds 1 at any n
    ("unnamed_2node_8gpu.txt", "Rank", "all_reduce",
     "redop sum, root -1, busbw/algbw 1.75, rank count not printed"),
    ("unnamed_table_2proc.txt", None, "broadcast", "redop none, root 0, busbw/algbw 1, rank count not printed"),
    # a reduce_scatter without its shell line: the redop says all_reduce or reduce_scatter, 7/8 says which
    ("old_reduce_scatter.txt", "$ ./build", "reduce_scatter", "redop sum, root -1, busbw/algbw 0.875, 8 ranks"),
    ("new_broadcast.txt", "$ ./build", "broadcast", "redop none, root 0, busbw/algbw 1, 8 ranks"),
    ("new_reduce_wrong.txt", "$ ./build", "reduce", "redop sum, root 0, busbw/algbw 1, 8 ranks"),
])
def test_op_inferred_from_the_busbw_over_algbw_ratio_and_columns(tmp_path, name, edit, op, table):
    path = DATA / name
    if edit is not None:
        path = tmp_path / "output.txt"
        path.write_text(_without((DATA / name).read_text(), edit))
    p, rec = record(path)
    assert p.op == op and rec.config["op_inferred"] == f"inferred from the table ({table}): only {op} fits"


def test_a_json_output_without_a_binary_name_is_inferred_too(tmp_path):
    doc = json.loads((DATA / "json_all_reduce_v1.json").read_text())
    doc["args"][0] = "./a.out"
    (tmp_path / "run.json").write_text(json.dumps(doc))
    p = parse_file(tmp_path / "run.json")
    assert p.op == "all_reduce" and "busbw/algbw 1.75, 8 ranks): only all_reduce fits" in p.op_inferred


def test_an_ambiguous_table_is_refused_naming_the_candidates(tmp_path):
    path = DATA / "unnamed_1node_8gpu.txt"
    msg = (r"unnamed_1node_8gpu\.txt: cannot tell which collective this is: the output does not name its "
           r"binary \(e\.g\. all_reduce_perf\), nor does its file name, and its table \(redop none, root -1, "
           r"busbw/algbw 0\.875, 8 ranks\) fits several collectives: all_gather, all_to_all; "
           r"pass --op \(one of: all_gather, all_to_all\)$")
    with pytest.raises(HarnessError, match=msg):
        parse_file(path)
    with pytest.raises(HarnessError, match="1 of 1 files cannot be imported"):
        cli([str(path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    assert parse_file(path, op="all_gather").op == "all_gather"  # --op settles it


def test_a_table_no_collective_fits_is_refused(tmp_path):
    text = (DATA / "unnamed_2node_8gpu.txt").read_text().replace("    7.99      0", "    6.99      0")
    (tmp_path / "output.txt").write_text(text)  # one row's busbw/algbw no longer 1.75
    with pytest.raises(HarnessError, match=r"fits none of the collectives: .*all_reduce: all_reduce's bus factor "
                                           r"2\(n-1\)/n = 1\.75 at 8 ranks is not the table's busbw/algbw"):
        parse_file(tmp_path / "output.txt")


# --- an op the data contradicts -------------------------------------------------------------------

@pytest.mark.parametrize("name, op, expect", [
    ("unnamed_2node_8gpu.txt", "all_gather", r"busbw/algbw is 1\.75 \(between 1\.74\d* and 1\.75\d* as printed\), "
     r"not all_gather's bus factor \(n-1\)/n = 0\.875 at 8 ranks"),
    ("unnamed_2node_8gpu.txt", "broadcast", r"busbw/algbw is 1\.75 .*not broadcast's bus factor 1$"),
    ("unnamed_1node_8gpu.txt", "all_reduce", r"busbw/algbw is 0\.875 .* not all_reduce's bus factor 2\(n-1\)/n "
     r"= 1\.75 at 8 ranks"),
    ("real_issue78_all_reduce.txt", "reduce_scatter", r"busbw/algbw is 1\.968 .* not reduce_scatter's bus factor "
     r"\(n-1\)/n at any rank count"),
    ("new_all_reduce.txt", "all_reduce", None),  # agreeing: fine
    ("unnamed_table_2proc.txt", "reduce", None),  # factor 1, as broadcast's
])
def test_an_op_the_busbw_ratio_contradicts_is_refused(name, op, expect):
    if expect is None:
        assert parse_file(DATA / name, op=op).op == op
        return
    with pytest.raises(HarnessError, match=r"^.*" + name.replace(".", r"\.") + f": op='{op}' given but the table "
                                           r"contradicts it: " + expect):
        parse_file(DATA / name, op=op)


def test_the_cli_refuses_a_contradicted_op_and_writes_nothing(tmp_path):
    with pytest.raises(HarnessError, match=r"op='all_gather' given but the table contradicts it"):
        cli([str(DATA / "unnamed_2node_8gpu.txt"), "--op", "all_gather", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_a_file_name_the_table_contradicts_is_refused(tmp_path):
    path = tmp_path / "allgather.txt"  # an all_reduce table under an all_gather name
    path.write_text((DATA / "unnamed_2node_8gpu.txt").read_text())
    with pytest.raises(HarnessError, match=r"allgather\.txt: the file name says all_gather but the table \(redop "
                                           r"sum, root -1, busbw/algbw 1\.75, 8 ranks\) does not fit it: all_gather "
                                           r"has no reduction, the table shows redop sum; pass --op \(one of: "
                                           r"all_reduce\)"):
        parse_file(path)
    (tmp_path / "broadcast.txt").write_text((DATA / "unnamed_1node_8gpu.txt").read_text())
    with pytest.raises(HarnessError, match=r"says broadcast but .* broadcast has a root >= 0, the table root -1; "
                                           r"pass --op \(one of: all_gather, all_to_all\)"):
        parse_file(tmp_path / "broadcast.txt")
