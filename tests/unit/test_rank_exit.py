"""How a rank program leaves: once its body has returned, nothing the interpreter would run at
teardown (atexit handlers, destructors of what DeepSpeed still holds) can turn the finished run
into a crash; a failing body still leaves its reason and a non-zero status."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from benchmarks.failure import EXIT_ERROR
from contract import events as ev

REPO = Path(__file__).resolve().parents[2]

RANK_PROGRAM = textwrap.dedent("""
    import atexit, os, sys
    from contract import events as ev
    from benchmarks.failure import run_rank

    def body(run_dir, log, rank, world_size):
        # What a gloo worker thread met at interpreter teardown did: abort the process.
        atexit.register(os.abort)
        if os.environ.get("BODY_FAILS"):
            raise RuntimeError("the body failed")
        log.emit(ev.RUN_START)
        log.emit(ev.RUN_STOP, status="success")

    run_rank(sys.argv[1:], "a rank", body)
    print("unreachable: run_rank returned")
""")


def run_rank_program(run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RANK_PROGRAM, "--run-dir", str(run_dir)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", **env})


def test_a_finished_rank_exits_zero_even_when_teardown_would_abort(tmp_path):
    done = run_rank_program(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "unreachable" not in done.stdout
    keys = [e["key"] for e in ev.read_events(tmp_path / ev.EVENTS_FILE)]
    assert keys == [ev.RUN_START, ev.RUN_STOP]


def test_a_failing_rank_still_records_why_and_exits_non_zero(tmp_path):
    done = run_rank_program(tmp_path, BODY_FAILS="1")
    assert done.returncode == EXIT_ERROR, done.stderr
    events = ev.read_events(tmp_path / ev.EVENTS_FILE)
    failure = next(e for e in events if e["key"] == ev.FAILURE)
    assert "RuntimeError: the body failed" in failure["value"]["reason"]
    assert events[-1]["key"] == ev.RUN_STOP and events[-1]["metadata"]["status"] == "aborted"
