"""nccl-tests outputs (harness.nccl_tests.importer): both text layouts and -J JSON parsed to rows, cut
outputs, busbw against nccl-tests' printed numbers, the command line, records and the import.
Inputs: tests/data/nccl_tests/ (README.md there says where each layout comes from)."""
from __future__ import annotations

import json
import os
import re
import stat
import statistics

import pytest
from unit_helpers import REPO_ROOT

from contract.collectives import OPS
from harness.collectives import Placement, Row, busbw_factor
from harness.errors import HarnessError
from harness.nccl_tests.importer import cli, import_files, records_from_output
from harness.nccl_tests.command import binary_for, command
from harness.nccl_tests.json_format import parse_file, parse_json
from harness.nccl_tests.output import ErrorValue, parse_text
from harness.record import validate_record

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"
H100, V100 = "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB"


def row(size, count, dtype, redop, root, oop, ip):
    return Row(size, count, dtype, redop, root, Placement(*oop), Placement(*ip))


# file, op argument, then what the parse must give: op, layout, rows, ranks, first row, last row,
# printed avg busbw, out-of-bounds, nccl version, first device, number of device lines, hosts
LAYOUTS = [
    ("old_all_reduce.txt", None, "all_reduce", "old", 13, 8,
     row(8, 2, "float", "sum", -1, (27.46, 0.0, 0.0, None), (29.06, 0.0, 0.0, None)),
     row(134217728, 33554432, "float", "sum", -1, (1132.0, 118.57, 207.50, None), (1150.8, 116.63, 204.10, None)),
     50.9384, 0, "2.11.4", V100, 8, ["dgx1-07"]),
    ("old_all_gather.txt", "all_gather", "all_gather", "old", 7, 4,
     row(1048576, 65536, "float", "none", -1, (39.22, 26.74, 20.05, None), (39.19, 26.75, 20.07, None)),
     row(67108864, 4194304, "float", "none", -1, (1143.6, 58.68, 44.01, None), (1140.2, 58.86, 44.14, None)),
     35.8688, 0, None, "Tesla V100-PCIE-16GB", 4, ["gpu-node3"]),
    ("old_broadcast_2proc.txt", None, "broadcast", "old", 6, 2,
     row(1048576, 262144, "float", "none", 0, (138.8, 7.56, 7.56, None), (142.2, 7.37, 7.37, None)),
     row(33554432, 8388608, "float", "none", 0, (3249.1, 10.33, 10.33, None), (3119.0, 10.76, 10.76, None)),
     9.64116, 0, "2.9.6", "Tesla V100-PCIE-16GB", 2, ["v100-a", "v100-b"]),
    ("old_reduce_scatter.txt", None, "reduce_scatter", "old", 7, 8,
     row(65536, 4096, "half", "sum", -1, (30.26, 2.17, 1.90, None), (29.93, 2.19, 1.92, None)),
     row(268435456, 16777216, "half", "sum", -1, (2430.3, 110.45, 96.65, None), (2417.2, 111.05, 97.17, None)),
     50.36, 0, None, V100, 8, ["dgx1-07"]),
    ("real_issue78_alltoall.txt", "all_to_all", "all_to_all", "old", 2, None,
     row(268435456, 1048576, "float", "none", -1, (520935, 0.52, 0.51, None), (519562, 0.52, 0.51, None)),
     row(536870912, 2097152, "float", "none", -1, (1041974, 0.52, 0.51, None), (1041299, 0.52, 0.51, None)),
     0.507636, 0, None, None, 0, []),
    ("new_all_reduce.txt", None, "all_reduce", "new", 14, 8,
     row(8, 2, "float", "sum", -1, (14.28, 0.0, 0.0, 0), (14.41, 0.0, 0.0, 0)),
     row(536870912, 134217728, "float", "sum", -1, (2016.8, 266.20, 465.85, 0), (2161.4, 248.39, 434.67, 0)),
     132.824, 0, "2.18.5", H100, 8, ["h100-node-01"]),
    ("new_broadcast.txt", None, "broadcast", "new", 10, 8,
     row(1024, 256, "float", "none", 0, (12.40, 0.08, 0.08, None), (12.43, 0.08, 0.08, None)),
     row(268435456, 67108864, "float", "none", 0, (805.8, 333.14, 333.14, None), (772.1, 347.65, 347.65, None)),
     121.323, 0, "2.18.5", H100, 8, ["h100-node-01"]),
    ("new_reduce_wrong.txt", None, "reduce", "new", 4, 8,
     row(1048576, 262144, "float", "sum", 0, (18.42, 56.93, 56.93, 0), (18.16, 57.73, 57.73, 0)),
     row(67108864, 16777216, "float", "sum", 0, (232.6, 288.46, 288.46, 0), (241.2, 278.20, 278.20, 0)),
     180.189, 1, "2.18.5", H100, 8, ["h100-node-01"]),
    ("new_all_gather.txt", None, "all_gather", "new", 26, 8,
     row(0, 0, "float", "none", -1, (0.14, 0.0, 0.0, 0), (0.20, 0.0, 0.0, 0)),
     row(268435456, 8388608, "float", "none", -1, (736.18, 364.63, 319.05, 0), (750.41, 357.72, 313.00, 0)),
     82.1051, 0, "2.27.3", H100, 8, ["h100-node-02"]),
    ("new_reduce_scatter_mpi.txt", None, "reduce_scatter", "new", 6, 16,
     row(1048576, 32768, "bfloat16", "avg", -1, (51.40, 20.40, 19.13, 0), (51.03, 20.55, 19.26, 0)),
     row(1073741824, 33554432, "bfloat16", "avg", -1, (11039.4, 97.26, 91.19, 0), (11346.2, 94.63, 88.72, 0)),
     66.4618, 0, "2.27.3", H100, 16, ["node-a", "node-b"]),
    ("new_sendrecv_timestamps.txt", None, "sendrecv", "new", 9, 8,
     row(1024, 256, "float", "none", -1, (9.15, 0.11, 0.11, 0), (9.04, 0.11, 0.11, 0)),
     row(67108864, 16777216, "float", "none", -1, (362.40, 185.18, 185.18, 0), (359.56, 186.64, 186.64, 0)),
     65.8482, 0, "2.27.3", H100, 8, ["h100-node-02"]),
    ("new_alltoall.txt", None, "all_to_all", "new", 10, 8,
     row(1048576, 32768, "float", "none", -1, (29.74, 35.26, 30.85, 0), (30.00, 34.96, 30.59, None)),
     row(536870912, 16777216, "float", "none", -1, (2411.86, 222.60, 194.77, 0), (2404.62, 223.27, 195.36, None)),
     136.755, 0, "2.27.3", H100, 8, ["h100-node-02"]),
    # 72 ranks read from busbw/algbw (only rank 71's line was pasted): the issue's own count, README.md
    ("real_coreweave43_all_reduce.txt", "all_reduce", "all_reduce", "new", 5, 72,
     row(536870912, 134217728, "float", "sum", -1, (1806.7, 297.16, 586.06, 0), (1835.9, 292.43, 576.74, 0)),
     row(8589934592, 2147483648, "float", "sum", -1, (20299, 423.16, 834.57, 0), (20006, 429.37, 846.82, 0)),
     745.53, 0, None, "NVIDIA Graphics Device", 1, ["slurm-gb200-207-171"]),
    ("json_all_reduce_v1.json", None, "all_reduce", "json", 13, 8,
     row(8, 2, "float", "sum", -1, (24.191355, 0.000331, 0.000579, 0), (24.542529, 0.000326, 0.00057, 0)),
     None, 24.037899, 0, "2.27.3", H100, 2, ["node-a", "node-b"]),
]


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: c[0])
def test_each_layout_parses_to_the_printed_rows(case):
    name, op_arg, op, layout, n_rows, ranks, first, last, avg, oob, nccl, device, n_dev, hosts = case
    p = parse_file(DATA / name, op=op_arg)
    assert (p.op, p.layout, len(p.rows), p.num_ranks, p.complete) == (op, layout, n_rows, ranks, True)
    assert p.rows[0] == first
    assert last is None or p.rows[-1] == last
    assert (p.avg_busbw_gbps, p.out_of_bounds, p.nccl_version) == (avg, oob, nccl)
    assert (p.devices[:1], len(p.devices), p.hosts) == ([device] if device else [], n_dev, hosts)
    assert p.num_dropped_rows == 0 and p.source == str(DATA / name)


def test_old_layout_keeps_the_error_column_and_no_wrong_counts():
    p = parse_file(DATA / "old_all_reduce.txt")
    assert all(pl.num_wrong is None for r in p.rows for pl in (r.out_of_place, r.in_place))
    assert [e.size_bytes for e in p.errors] == [r.size_bytes for r in p.rows]
    assert p.errors[0] == ErrorValue(8, 0.0, 0.0) and p.errors[-1] == ErrorValue(134217728, 1e-07, 1e-07)
    assert parse_file(DATA / "old_broadcast_2proc.txt").errors[0] == ErrorValue(1048576, None, None)
    a2a = parse_file(DATA / "real_issue78_alltoall.txt", op="all_to_all")
    assert a2a.errors[0] == ErrorValue(268435456, 0.0, 1.0)  # in-place alltoall is not checked ...
    assert records_from_output(a2a, run_id="a", platform="p", source_file="f").status == "ok"  # ... OOB 0


def test_old_layout_without_out_of_bounds_line_is_complete():
    text = (DATA / "old_all_reduce.txt").read_text()
    p = parse_text("\n".join(ln for ln in text.splitlines() if "Out of bounds" not in ln) + "\n")
    assert (p.out_of_bounds, p.complete, len(p.rows)) == (None, True, 13)


def test_new_layout_wrong_values_and_their_g_format():
    p = parse_file(DATA / "new_reduce_wrong.txt")
    assert p.rows[2].in_place.num_wrong == 1048580  # printed by %5g as 1.04858e+06
    rec = records_from_output(p, run_id="r", platform="h100", source_file="f")
    assert rec.status == "error" and "#wrong > 0" in rec.reason and "Out of bounds values: 1" in rec.reason


def test_header_facts():
    p = parse_file(DATA / "new_reduce_scatter_mpi.txt")
    assert p.nccl_tests_version == "2.17.9" and p.run_config.num_gpus == 8 and p.run_config.step_factor == 4
    assert (p.run_config.iters, p.run_config.agg_iters, p.run_config.check_iters) == (20, 1, 1)
    old = parse_file(DATA / "old_broadcast_2proc.txt")
    assert (old.cuda_version, old.run_config.check_iters, old.run_config.agg_iters) == ("11.2", 0, None)


# --- busbw and algbw as nccl-tests printed them ------------------------------------------------

# file, op argument, ranks (None: the parse must find them; else from README.md provenance)
BANDWIDTH = [(name, op_arg, None) for name, op_arg, *_ in LAYOUTS if "real_" not in name] + [
    ("real_issue78_all_reduce.txt", "all_reduce", 64), ("real_issue78_alltoall.txt", "all_to_all", 64),
    ("real_coreweave43_all_reduce.txt", "all_reduce", 72), ("json_all_gather_v2_failed.json", None, None),
    ("json_all_reduce_v1.stdout.txt", None, None), ("old_all_gather.txt", "all_gather", None),
    ("unnamed_2node_8gpu.txt", None, None), ("unnamed_1node_8gpu.txt", "all_gather", None),
    ("alltoall-16gpu.log", None, None), ("unnamed_table_2proc.txt", None, 2)]


def busbw_deviation(p, num_ranks: int) -> float:
    """Largest |busbw - algbw x factor| as a fraction of what the printed rounding allows."""
    worst = 0.0
    half = 5e-7 if p.layout == "json" else 0.005  # %lf vs %6.2f
    for r in p.rows:
        for pl in (r.out_of_place, r.in_place):
            f = busbw_factor(p.op, num_ranks)
            worst = max(worst, abs(pl.busbw_gbps - pl.algbw_gbps * f) / (half * (1 + f) + 1e-12))
    return worst


@pytest.mark.parametrize("name, op_arg, ranks", BANDWIDTH, ids=lambda v: str(v))
def test_busbw_factor_matches_nccl_tests_printed_numbers(name, op_arg, ranks):
    p = parse_file(DATA / name, op=op_arg)
    n = ranks or p.num_ranks
    assert n and busbw_deviation(p, n) <= 1.0


def test_busbw_check_detects_a_wrong_rank_count():
    p = parse_file(DATA / "real_issue78_all_reduce.txt", op="all_reduce")
    assert busbw_deviation(p, 64) <= 1.0 < busbw_deviation(p, 8)


@pytest.mark.parametrize("name, op_arg, ranks", BANDWIDTH, ids=lambda v: str(v))
def test_algbw_is_size_over_time(name, op_arg, ranks):
    p = parse_file(DATA / name, op=op_arg)
    for r in p.rows:
        for pl in (r.out_of_place, r.in_place):
            t = pl.time_us
            t_half = 5e-7 if p.layout == "json" else 0.5 if t >= 10000 else 0.05 if t >= 100 else 0.005
            tol = (5e-7 if p.layout == "json" else 0.005) + pl.algbw_gbps * t_half / t + 1e-9
            assert abs(pl.algbw_gbps - r.size_bytes / t / 1e3) <= tol, (r.size_bytes, pl)


@pytest.mark.parametrize("name, op_arg, ranks", [b for b in BANDWIDTH if "failed" not in b[0]],
                         ids=lambda v: str(v))
def test_avg_busbw_is_the_mean_of_every_placement(name, op_arg, ranks):
    p = parse_file(DATA / name, op=op_arg)
    mean = statistics.fmean(pl.busbw_gbps for r in p.rows for pl in (r.out_of_place, r.in_place))
    assert abs(p.avg_busbw_gbps - mean) <= (5e-7 if p.layout == "json" else 0.005) + 1e-5 * mean


def test_json_rows_equal_the_same_runs_stdout():
    js = parse_file(DATA / "json_all_reduce_v1.json")
    txt = parse_file(DATA / "json_all_reduce_v1.stdout.txt")
    assert len(js.rows) == len(txt.rows) == 13 and js.num_ranks == txt.num_ranks == 8
    for a, b in zip(js.rows, txt.rows):
        assert (a.size_bytes, a.count, a.dtype, a.redop, a.root) == (
            b.size_bytes, b.count, b.dtype, b.redop, b.root)
        for pa, pb in ((a.out_of_place, b.out_of_place), (a.in_place, b.in_place)):
            assert abs(pa.time_us - pb.time_us) <= 0.005 and abs(pa.busbw_gbps - pb.busbw_gbps) <= 0.005
            assert pa.num_wrong == pb.num_wrong == 0
    assert js.env == {"NCCL_DEBUG": "VERSION", "NCCL_IB_HCA": "mlx5_0,mlx5_3", "NCCL_SOCKET_IFNAME": "eth0",
                      "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert js.args[0] == "./build/all_reduce_perf" and js.wall_s == 12.0 and js.run_config.num_gpus == 4


# --- cut outputs ---------------------------------------------------------------------------------

# file, op argument, complete rows kept, rows dropped, text in the reason
CUT = [
    ("cut_mid_row.txt", None, 9, 1, "cut short after 9 complete rows (1 incomplete dropped)"),
    ("cut_before_footer.txt", None, 10, 0, "cut short after 10 complete rows"),
    ("failed_mid_row.txt", None, 20, 1, "Test NCCL failure common.cu:1093"),
    ("json_all_reduce_v1_cut.json", None, 11, 1, "cut short after 11 complete rows (1 incomplete dropped)"),
    ("json_all_gather_v2_failed.json", None, 5, 1, "cut short after 5 complete rows (1 incomplete dropped)"),
]


@pytest.mark.parametrize("name, op_arg, kept, dropped, reason", CUT, ids=lambda v: str(v))
def test_cut_output_keeps_only_complete_rows_and_the_record_says_so(name, op_arg, kept, dropped, reason):
    p = parse_file(DATA / name, op=op_arg)
    assert (len(p.rows), p.num_dropped_rows, p.complete, p.avg_busbw_gbps) == (kept, dropped, False, None)
    rec = records_from_output(p, run_id="cut", platform="h100", source_file=name)
    assert rec.status == "error" and reason in rec.reason and rec.complete is False
    assert validate_record(rec.to_dict()) == []


@pytest.mark.parametrize("name", ["new_all_reduce.txt", "old_all_reduce.txt", "new_reduce_scatter_mpi.txt"])
def test_a_cut_anywhere_keeps_exactly_the_finished_rows(name):
    text = (DATA / name).read_text()
    full = parse_text(text).rows
    for cut in range(text.index("(B)"), len(text) - 1, 5):
        p = parse_text(text[:cut])
        finished = sum(1 for ln in text[:cut].split("\n")[:-1] if re.match(r"(\[1,0\]<stdout>:)?\s+\d", ln))
        footer = re.search(r"Avg bus bandwidth\s*: \S+ ", text[:cut]) is not None
        assert p.rows == full[:finished] and p.complete is footer, cut  # never repaired, never more


def test_json_cut_before_any_result_has_no_rows():
    text = (DATA / "json_all_reduce_v1.json").read_text()
    p = parse_json(text[:text.index('"results"') + 5], "early.json")
    assert (p.rows, p.complete, p.num_ranks, p.op) == ([], False, 8, "all_reduce")


# --- what is not nccl-tests output, and bad input -------------------------------------------------

def test_non_nccl_tests_file_is_a_clear_error(tmp_path):
    path = DATA / "not_nccl_tests.txt"
    with pytest.raises(HarnessError, match=r"^" + str(path) + ": not nccl-tests output: no column header"):
        parse_file(path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "other.json").write_text('{"metrics": [1, 2]}')
    for name in ("empty.txt", "other.json"):
        with pytest.raises(HarnessError, match=f"{name}: not nccl-tests output"):
            parse_file(tmp_path / name)
    with pytest.raises(HarnessError, match="missing.txt: cannot read"):
        parse_file(tmp_path / "missing.txt")


HEADER = "# Collective test starting: {0}\n#       size         count      type   redop    root     time   " \
         "algbw   busbw #wrong     time   algbw   busbw #wrong\n"
ROW = ("        1024           256     float    none      -1    12.40    0.08    0.07      0    12.43    0.08"
       "    0.07      0\n")


@pytest.mark.parametrize("text, op_arg, expect", [
    (HEADER.format("alltoall_perf") + ROW, None, "all_to_all"),
    (HEADER.format("sendrecv_perf") + ROW, None, "sendrecv"),
    ("$ mpirun -np 16 ./build/all_gather_perf_mpi -b 1K\n" + HEADER.format("") + ROW, None, "all_gather"),
    (HEADER.format("") + ROW, "broadcast", "broadcast"),
    (HEADER.format("alltoall_perf") + ROW, "all_reduce",
     "op='all_reduce' given but the output is from alltoall_perf"),
    (HEADER.format("") + ROW, None, "does not name its binary"),
    ("./all_reduce_perf; ./reduce_perf\n" + HEADER.format("") + ROW, None, "names several binaries"),
    (HEADER.format("gather_perf") + ROW, None, "gather_perf is not a collective this suite records"),
    (HEADER.format("") + ROW, "allreduce", "op='allreduce' is invalid"),
])
def test_op_comes_from_the_binary_name_or_the_argument(text, op_arg, expect):
    if expect in OPS:
        assert parse_text(text, "t.txt", op=op_arg).op == expect
    else:
        with pytest.raises(HarnessError, match=r"^t\.txt: .*" + expect.replace("(", r"\(")):
            parse_text(text, "t.txt", op=op_arg)


@pytest.mark.parametrize("change, expect", [
    (lambda t: t.replace("   540.5  248.32", "   540.5  248.x2"),
     r"x\.txt:30: out-of-place algbw: '248\.x2' is not a number"),
    (lambda t: t.replace("451.96      0\n", "451.96      0   9\n"),
     r"x\.txt:30: 1 more fields than the column header has: 9"),
    (lambda t: t.replace("434.56      0    519.7", "434.56    0.5    519.7"),
     r"x\.txt:30: out-of-place #wrong '0\.5' is not a count"),
    (lambda t: t + t[t.index("#       size"):], r"x\.txt:36: a second results table"),
    (lambda t: t.replace("#wrong     time", "#wrong    time  extra"),
     r"x\.txt:16: unrecognised nccl-tests column"),
])
def test_malformed_output_names_the_file_line_and_the_problem(change, expect):
    with pytest.raises(HarnessError, match=expect):
        parse_text(change((DATA / "new_all_reduce.txt").read_text()), "x.txt")


# --- driving the binaries --------------------------------------------------------------------------

def test_command_argv_for_a_representative_config():
    argv = command("/opt/nccl-tests/build/all_reduce_perf", min_bytes=1024, max_bytes=1 << 30,
                   step_factor=2.0, step_bytes=0, gpus_per_proc=8, iters=20, warmup_iters=5, check=True,
                   dtype="bfloat16", redop="avg", json_out="/tmp/run/ar.json")
    assert argv == ["/opt/nccl-tests/build/all_reduce_perf", "-b", "1024", "-e", "1073741824", "-f", "2",
                    "-g", "8", "-n", "20", "-w", "5", "-c", "1", "-d", "bfloat16", "-o", "avg",
                    "-J", "/tmp/run/ar.json"]
    argv = command("broadcast_perf", min_bytes=8, max_bytes=64, step_factor=2.0, step_bytes=8,
                   gpus_per_proc=1, iters=5, warmup_iters=0, check=False, dtype="float32", redop="sum",
                   json_out=None)
    assert argv[5:7] == ["-i", "8"] and argv[13:17] == ["-c", "0", "-d", "float"] and "-J" not in argv
    assert command("sendrecv_perf", min_bytes=1, max_bytes=1, dtype="float16")[16] == "half"


BASE = dict(min_bytes=1024, max_bytes=4096, step_factor=2.0, step_bytes=0, gpus_per_proc=1, iters=20,
            warmup_iters=5, check=True, dtype="float32", redop="sum", json_out=None)


@pytest.mark.parametrize("change, expect", [
    ({"min_bytes": 8192}, "min_bytes=8192 is invalid; must not exceed max_bytes=4096"),
    ({"min_bytes": 0}, "min_bytes=0 is invalid; must be >= 1 byte"),
    ({"dtype": "fp8"}, "dtype='fp8' is invalid; valid: float32, float16, bfloat16"),
    ({"redop": "mean"}, "redop='mean' is invalid; valid: sum, prod, max, min, avg"),
    ({"step_factor": 1.5}, "step_factor=1.5 is invalid; nccl-tests -f takes an integer >= 2"),
    ({"step_bytes": -1}, "step_bytes=-1 is invalid"),
    ({"iters": 0}, "iters=0 is invalid; must be >= 1"),
    ({"gpus_per_proc": 0}, "gpus_per_proc=0 is invalid"),
    ({"json_out": "out.txt"}, "json_out='out.txt' is invalid; must end in .json"),
    ({"binary": "/opt/bin/gather_perf"}, "binary='/opt/bin/gather_perf' is invalid; valid: a path to one "
                                         "of all_reduce_perf, all_gather_perf"),
])
def test_command_rejects_bad_values_naming_them(change, expect):
    args = {"binary": "/opt/nccl-tests/build/all_reduce_perf", **BASE, **change}
    with pytest.raises(HarnessError, match=expect.replace("(", r"\(").replace(".", r"\.")):
        command(args.pop("binary"), **args)


def test_binary_for_looks_in_the_folder_or_on_path(tmp_path, monkeypatch):
    exe = tmp_path / "alltoall_perf"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "reduce_perf").write_text("not executable")
    assert binary_for("all_to_all", str(tmp_path)) == str(exe)
    assert binary_for("reduce", str(tmp_path)) is None and binary_for("all_reduce", str(tmp_path)) is None
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + "/nonexistent")
    assert binary_for("all_to_all", None) == str(exe) and binary_for("sendrecv", None) is None
    (tmp_path / "alltoall_perf_mpi").symlink_to(exe)
    assert binary_for("all_to_all", None, suffix="_mpi") == str(tmp_path / "alltoall_perf_mpi")
    with pytest.raises(HarnessError, match="op='gather' has no nccl-tests binary; valid: all_reduce"):
        binary_for("gather", None)


# --- records and the import ---------------------------------------------------------------------

@pytest.mark.parametrize("name, op_arg, status", [(c[0], c[1], "error" if "wrong" in c[0] else "ok")
                                                 for c in LAYOUTS])
def test_records_validate_against_the_schema(name, op_arg, status):
    p = parse_file(DATA / name, op=op_arg)
    rec = records_from_output(p, run_id="nccl-tests-x", platform="h100", source_file=str(DATA / name))
    data = rec.to_dict()
    assert validate_record(data) == [] and rec.status == status and rec.kind == "collective"
    assert rec.source == ("nccl-tests-json" if name.endswith(".json") else "nccl-tests")
    assert data["rows"] == [r.to_dict() for r in p.rows] and data["benchmark"] == p.op
    env = data["environment"]
    assert (env["nccl"], env["hosts"], env["torch"]) == (p.nccl_version, p.hosts, None)
    assert env["gpu_count"] == (p.num_ranks or len(p.devices))
    assert env["gpu_model"] == (p.devices[0] if p.devices else None)


def test_import_writes_one_record_per_file_and_refuses_to_overwrite(tmp_path):
    files = [str(DATA / "new_all_reduce.txt"), str(DATA / "json_all_reduce_v1.json")]
    paths = import_files(files, tmp_path / "out", platform="h100")
    assert [p.name for p in paths] == ["nccl-tests-new_all_reduce.json", "nccl-tests-json_all_reduce_v1.json"]
    recs = [json.loads(p.read_text()) for p in paths]
    assert [r["status"] for r in recs] == ["ok", "ok"] and all(validate_record(r) == [] for r in recs)
    before = paths[0].read_text()
    with pytest.raises(HarnessError, match="refusing to overwrite existing records"):
        import_files(files, tmp_path / "out", platform="h100")
    assert paths[0].read_text() == before


def test_import_writes_nothing_when_a_file_is_bad_and_lists_every_bad_one(tmp_path):
    files = [str(DATA / name) for name in ("new_all_reduce.txt", "not_nccl_tests.txt", "unnamed_1node_8gpu.txt")]
    with pytest.raises(HarnessError) as err:
        import_files(files, tmp_path / "out")
    msg = str(err.value)
    assert msg.startswith("2 of 3 files cannot be imported (nothing written)")
    assert "not_nccl_tests.txt: not nccl-tests output" in msg and "unnamed_1node_8gpu.txt: cannot tell" in msg
    assert not (tmp_path / "out").exists()


def test_cli_prints_one_line_per_record_and_exits_3_on_an_error_record(tmp_path, capsys):
    out = tmp_path / "rec"
    assert cli([str(DATA / "old_all_gather.txt"), "--op", "all_gather", "--out", str(out),
                "--platform", "v100"]) == 0
    assert capsys.readouterr().out.strip() == f"{out / 'nccl-tests-old_all_gather.json'}: all_gather, 7 rows, ok"
    assert cli([str(DATA / "cut_mid_row.txt"), "--out", str(out)]) == 3
    assert "cut_mid_row.json: all_reduce, 9 rows, error (output cut short" in capsys.readouterr().out
    with pytest.raises(HarnessError, match="import-nccl-tests: .*invalid choice: 'allreduce'"):
        cli([str(DATA / "cut_mid_row.txt"), "--op", "allreduce"])
