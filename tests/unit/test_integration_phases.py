"""`make test`'s two integration phases (tests/integration/conftest.py): `-m measuring` selects exactly the modules
whose assertions read what the box measured, run alone; `-m "not measuring"` the rest, run two at a time, each
module one unit of work, the real-Slurm modules and the image's tests one unit, queued first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.integration import conftest, units

REPO = Path(__file__).resolve().parents[2]
MODULES = {p.stem for p in (REPO / "tests" / "integration").glob("test_*.py")}


def test_every_named_module_exists_and_the_groups_do_not_overlap():
    named = [conftest.MEASURING, set(conftest.ONE_WORKER), set(conftest.LONGEST)]
    for group in named:
        assert group <= MODULES, group - MODULES
    assert not conftest.MEASURING & set(conftest.ONE_WORKER) and not conftest.MEASURING & set(conftest.LONGEST)
    assert not set(conftest.ONE_WORKER) & set(conftest.LONGEST)
    assert conftest.ONE_WORKER[-1] == conftest.BACKGROUND_USER
    slurm = {m for m in MODULES if m.startswith("test_slurm")}   # they share the session's one Slurm
    assert slurm <= set(conftest.ONE_WORKER)


def _item(module: str):
    return SimpleNamespace(module=SimpleNamespace(__name__=f"tests.integration.{module}"))


def test_the_queue_puts_the_one_worker_group_first_and_the_image_last_in_it():
    modules = ["test_failures", "test_image", "test_tune", "test_slurm_tune", "test_nightly", "test_slurm",
               "test_gpu_check", "test_collectives"]
    ordered = [i.module.__name__.rsplit(".", 1)[-1] for i in sorted(map(_item, modules), key=conftest._order)]
    assert ordered == ["test_nightly", "test_slurm", "test_slurm_tune", "test_image", "test_tune", "test_gpu_check",
                       "test_failures", "test_collectives"]


def test_the_measuring_phase_collects_exactly_the_measuring_modules():
    """The marker is given before `-m` deselects (the hook runs first): a marker given after would select nothing."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "measuring", "tests/integration"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    collected = {line.split("::", 1)[0].rsplit("/", 1)[-1][:-3] for line in out.stdout.splitlines() if "::" in line}
    assert collected == conftest.MEASURING & MODULES


def test_the_units_are_modules_and_the_one_worker_group_is_one():
    """xdist's loadgroup does nothing under pytest 9.2 (it renames `_nodeid`, pytest keeps `_id`): units.py's
    scheduler makes the units from the node ids themselves."""
    scope = units.ModuleUnits._split_scope
    assert scope(None, "tests/integration/test_slurm.py::test_a") == scope(None, "tests/integration/test_image.py::t[x]")
    assert scope(None, "tests/integration/test_tune.py::test_a") == scope(None, "tests/integration/test_tune.py::test_b")
    assert scope(None, "tests/integration/test_tune.py::test_a") != scope(None, "tests/integration/test_failures.py::t")


FLAKY = '''
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.parametrize("case", ["a b", "c"])
def test_one_case_fails(case):
    assert case == "c"
'''


def test_what_failed_beside_another_worker_is_listed_and_run_again_alone(tmp_path):
    """--failed-to: the controller of a two-worker run lists the failed tests' node ids (a parameter with a space
    too); --only-from: a second run, alone, runs exactly those (make test's rerun of the second phase)."""
    (tmp_path / "test_flaky.py").write_text(FLAKY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    listed = tmp_path / "failed.txt"

    def pytest(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.integration.units",
                               "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), *args, str(tmp_path)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)

    first = pytest("-n", "2", "--failed-to", str(listed))
    assert first.returncode == 1 and "2 failed, 2 passed" in first.stdout, first.stdout[-2000:] + first.stderr[-2000:]
    assert sorted(listed.read_text().splitlines()) == ["test_flaky.py::test_fails", "test_flaky.py::test_one_case_fails[a b]"]
    again = pytest("--only-from", str(listed))
    assert again.returncode == 1 and "2 failed, 2 deselected" in again.stdout, again.stdout[-2000:]
    listed.write_text("test_flaky.py::test_passes\n")
    assert pytest("--only-from", str(listed)).returncode == 0
