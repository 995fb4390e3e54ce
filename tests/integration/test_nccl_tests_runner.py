"""The harness drives nccl-tests binaries: command line, launch, parse, record.

No GPU or nccl-tests build exists on CI, so the binary here is a stand-in that records the argv
it was given and prints a captured nccl-tests output (tests/data/nccl_tests). What is tested is
the harness's side: the argv it builds, the launch, and the record it makes of the output.
"""
from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from harness.nccl_tests.json_format import parse_file
from harness.record import validate_record

from .conftest import run_bench

pytestmark = pytest.mark.integration
DATA = Path(__file__).resolve().parents[1] / "data" / "nccl_tests"


def stand_in(folder: Path, name: str, output: Path, exit_code: int = 0) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f"""#!{sys.executable}
import json, sys
json.dump(sys.argv[1:], open({str(folder / (name + '.argv.json'))!r}, "w"))
sys.stdout.write(open({str(output)!r}).read())
sys.exit({exit_code})
""")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def bench(tmp_path: Path, *extra: str):
    return run_bench(tmp_path / "out", "platform=h100", "suite=single", "kind=collective",
                     "collective.ops=[all_reduce]", "collective.source=nccl-tests",
                     f"collective.nccl_tests_dir={tmp_path / 'bin'}", "collective.min_bytes=8",
                     "collective.max_bytes=134217728", *extra)


def test_the_harness_runs_an_nccl_tests_binary_and_records_its_rows(tmp_path):
    output = DATA / "new_all_reduce.txt"
    stand_in(tmp_path / "bin", "all_reduce_perf", output)
    run = bench(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    argv = json.loads((tmp_path / "bin" / "all_reduce_perf.argv.json").read_text())
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["-b"] == "8" and pairs["-e"] == "134217728" and pairs["-f"] == "2"
    assert pairs["-g"] == "1" and pairs["-n"] == "20" and pairs["-w"] == "5" and pairs["-c"] == "1"
    assert pairs["-d"] == "float" and pairs["-o"] == "sum"
    (rec,) = run.records().values()
    assert validate_record(rec) == []
    assert rec["kind"] == "collective" and rec["source"] == "nccl-tests" and rec["status"] == "ok"
    expected = parse_file(output, "all_reduce")
    assert [r["size_bytes"] for r in rec["rows"]] == [r.size_bytes for r in expected.rows]
    assert rec["metrics"]["avg_busbw_gbps"]["value"] > 0
    assert rec["environment"]["suite_commit"]


def test_a_cut_short_output_keeps_complete_rows_and_says_so(tmp_path):
    stand_in(tmp_path / "bin", "all_reduce_perf", DATA / "cut_mid_row.txt", exit_code=1)
    run = bench(tmp_path)
    assert run.returncode == 3
    (rec,) = run.records().values()
    assert rec["status"] == "error" and rec["complete"] is False
    assert "rank 0 exited with code 1" in rec["reason"]
    assert rec["rows"] == [r.to_dict() for r in parse_file(DATA / "cut_mid_row.txt", "all_reduce").rows]


def test_a_missing_binary_stops_before_launch(tmp_path):
    (tmp_path / "bin").mkdir()
    run = bench(tmp_path)
    assert run.returncode == 2
    assert "all_reduce binary is not in collective.nccl_tests_dir" in run.stderr
    assert not (tmp_path / "out").exists()


def test_import_nccl_tests_outputs_saved_on_a_cluster(tmp_path):
    import subprocess

    from .conftest import REPO

    files = [str(DATA / "new_all_reduce.txt"), str(DATA / "json_all_reduce_v1.json")]
    proc = subprocess.run([sys.executable, "-m", "harness", "import-nccl-tests", *files,
                           "--out", str(tmp_path / "imported"), "--platform", "h100"],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "imported").glob("*.json"))]
    assert len(records) == 2
    assert {r["source"] for r in records} == {"nccl-tests", "nccl-tests-json"}
    assert all(validate_record(r) == [] and r["platform"] == "h100" for r in records)
    bad = subprocess.run([sys.executable, "-m", "harness", "import-nccl-tests",
                          str(DATA / "not_nccl_tests.txt"), "--out", str(tmp_path / "bad")],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "not nccl-tests output" in bad.stderr
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
