"""Integration tests: the real CLI, real rank processes (two gloo ranks), the tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class BenchRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def records(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.out.glob("*.json"))
                if p.name != "suite.json"}

    def first_records(self) -> dict[str, dict]:
        """The records of the suite's own runs, without those of a regression's reruns (confirm_regressions)."""
        from harness.verdict.confirmation import first_run_id

        return {k: r for k, r in self.records().items() if first_run_id(k) == k}


def harness_cmd(out: Path, *overrides: str) -> list[str]:
    """`python -m harness bench` into `out`; a regression its first run reads is not run again (confirm_regressions=0)
    unless the overrides say otherwise: what a test judges is its run's record, and a rerun would add records and
    minutes wherever the box's noise read one (the confirmation's own test: test_confirm_regressions.py)."""
    confirm = [] if any(o.startswith("confirm_regressions=") for o in overrides) else ["confirm_regressions=0"]
    return [sys.executable, "-m", "harness", "bench", f"out={out}", *confirm, *overrides]


def run_bench(out: Path, *overrides: str, timeout: float = 900) -> BenchRun:
    proc = subprocess.run(harness_cmd(out, *overrides), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return BenchRun(proc.returncode, proc.stdout, proc.stderr, out)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_no_rank_left(run_dir: Path) -> None:
    pids = json.loads((run_dir / "pids.json").read_text())
    alive = {rank: pid for rank, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"rank processes left behind: {alive}"


MACHINE_MOVED_WORDS = (" matmul ", "memory bandwidth (triad)", "the machine ran", "other work took")
"""What a "not comparable" reason says when the machine itself measured otherwise than its baseline: a
probe figure beyond its tolerance, the pace rule, or other work that took the ranks' CPU time."""


def machine_moved(reasons: list[str]) -> list[str]:
    """The "not comparable" reasons among `reasons` that the machine's own measurement gave."""
    return [r.strip() for r in reasons if r.strip().startswith("not comparable")
            and any(w in r for w in MACHINE_MOVED_WORDS)]


def until_the_machine_holds(store: Path, attempt, attempts: int = 3):
    """attempt(k) -> (result, its "not comparable" reasons by the machine (machine_moved)), run again
    while those are not empty, against the history store as it was before the first attempt, up to
    `attempts` in all; the last result. A 2-core VM can measure itself otherwise between two benches
    (its host's neighbours): its verdicts are then rightly "not comparable", and what the test judges
    is untested."""
    kept = store.with_name(store.stem + "-before-attempts" + store.suffix)
    kept.write_bytes(store.read_bytes())
    for k in range(1, attempts + 1):
        result, moved = attempt(k)
        if not moved or k == attempts:
            return result
        print(f"attempt {k}: the machine measured otherwise than its baseline:\n  " + "\n  ".join(moved))
        store.write_bytes(kept.read_bytes())


def night_until_the_machine_holds(tmp_path: Path, night: str, run_night):
    """run_night() -> the nightly's CompletedProcess for `night` (its out folder tmp_path/night, its
    store tmp_path/history.sqlite), run again while its junit.xml's skipped verdicts say the machine
    measured itself otherwise than the earlier nights (until_the_machine_holds): each moved attempt's
    folder kept beside it as <night>-machine-moved-<k>. The last attempt's result."""
    import xml.etree.ElementTree as ET

    def attempt(k: int):
        if k > 1:
            (tmp_path / night).rename(tmp_path / f"{night}-machine-moved-{k - 1}")
        result = run_night()
        junit = tmp_path / night / "junit.xml"
        skipped = [s.get("message", "") for s in ET.parse(junit).iter("skipped")] if junit.exists() else []
        return result, machine_moved(skipped)

    return until_the_machine_holds(tmp_path / "history.sqlite", attempt)


# --- the session's order: what measures first, then what measures nothing beside the background work
from . import background  # noqa: E402

MEASURING = frozenset({
    "test_attribution", "test_cpu_cluster", "test_default_suite", "test_distillation", "test_emulated_cluster",
    "test_fingerprint", "test_golden_records", "test_machine_baseline", "test_nightly", "test_peak_memory",
    "test_postgres_store", "test_straggler", "test_confirm_regressions"})
"""The modules whose assertions read what the box measured (verdicts against references or a baseline, the
probe, the pace, step times against the model, a shaped link's rate) or the default suite that some of
them share: they run first, on the box as it was when every test ran alone and before the real-Slurm
tests' daemons start; the background work (background.py) starts after them. test_straggler and
test_confirm_regressions joined them when, beside the image's first build on the 2-core AVX2 EPYC, the ranks' arrival
(a rank slowed 0.08 s a micro-step read no rising straggler; alone: 5, 11, 24 %) and a slowed run's step (1.41x, not
beyond the 25 %) were the build's as much as the test's."""
from .units import BACKGROUND_USER, LONGEST, ONE_WORKER  # noqa: E402


def _module(node) -> str:
    """The test module's short name of a test item or a fixture request ("" for neither)."""
    module = getattr(node, "module", None)
    return module.__name__.rsplit(".", 1)[-1] if module is not None else ""


def _in_worker() -> bool:
    """This process is a pytest-xdist worker (make test's second integration phase)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def _order(item) -> tuple[int, int]:
    module = _module(item)
    if module in MEASURING:
        return 0, 0
    if module == BACKGROUND_USER:
        return 1, len(ONE_WORKER)
    if module in ONE_WORKER:
        return 1, ONE_WORKER.index(module)
    return (2, LONGEST.index(module)) if module in LONGEST else (3, 0)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Each item of a MEASURING module marked `measuring` (`-m` selects a phase), before `-m` deselects. Then the
    order (xdist's queue under --no-loadscope-reorder; units.py makes the units): the measuring modules,
    ONE_WORKER's unit with the image's tests last, LONGEST, the others; stable within each."""
    for item in items:
        if _module(item) in MEASURING:
            item.add_marker(pytest.mark.measuring)
    items.sort(key=_order)


def pytest_runtest_setup(item):
    if _in_worker() and _module(item) in MEASURING:
        pytest.fail(f"{_module(item)} measures the box: it runs alone, never beside another worker "
                    "(make test runs it first, with `-m measuring` and no -n)", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def background_build(request):
    """The image's first build starts in the background, when the session has the image's tests: one at a time,
    with the first module that measures nothing (every measuring module has run by then: the order above); two at a
    time, with the first module of ONE_WORKER's group, in the worker that runs the image's tests."""
    module = _module(request)
    starts = module in ONE_WORKER if _in_worker() else module not in MEASURING
    if starts and any(_module(i) == BACKGROUND_USER for i in request.session.items):
        from .test_image import BUILD_JOB, first_build

        background.start(BUILD_JOB, first_build)


@pytest.fixture(scope="session")
def default_suite(tmp_path_factory) -> BenchRun:
    """The cpu default suite, as `make bench` runs it, with fewer steps: a run whose first records read a regression
    runs again (confirm_regressions, as `make bench` does), so its records may hold those reruns (first_records: the
    suite's own)."""
    out = tmp_path_factory.mktemp("default") / "out"
    return run_bench(out, "measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=2",
                     "confirm_regressions=2")


# --- a real single-node Slurm on localhost (tests/slurm_cluster.py) ------------------------------
from collections.abc import Iterator  # noqa: E402

from ..slurm_cluster import SlurmCluster, is_client_variable  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: uses the real single-node Slurm of the slurm_cluster fixture (skipped "
        "when it cannot be provided, unless SUITE_REQUIRE_SLURM=1)")
    config.addinivalue_line(
        "markers", "cluster: uses the emulated multi-node cluster (testbed/; skipped without root, unless in CI)")
    config.addinivalue_line(
        "markers", "measuring: its assertions read what the box measured (MEASURING); runs alone, never under -n")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """A private slurmctld + slurmd + munged on localhost, once per session, partition "debug".

    Installs the Debian packages when missing (root only). For the session, os.environ gets
    SLURM_CONF and loses other Slurm client variables (SLURM_*, SBATCH_*, ...; all restored
    afterwards), so code that runs sbatch/squeue/scontrol/scancel/srun with the inherited
    environment talks to this cluster. Skips when the cluster cannot be provided;
    with SUITE_REQUIRE_SLURM=1 (CI) that is a failure instead.
    """
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    start_or_skip(cluster, "Slurm cluster")
    # SLURM_CONF points at the cluster; SLURM_JOB_ID & co. of an outer Slurm job (CI inside
    # salloc) would make srun/sbatch talk about jobs this cluster never had: hidden meanwhile
    saved = {key: value for key, value in os.environ.items() if is_client_variable(key)}
    for key in saved:
        del os.environ[key]
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        for key in [key for key in os.environ if is_client_variable(key)]:
            del os.environ[key]
        os.environ.update(saved)
        cluster.stop()


@pytest.fixture
def no_slurm_job_left(slurm_cluster):
    """A test that fails half-way must not leave a job holding the node's CPUs for the next."""
    yield
    jobs = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    if jobs:
        subprocess.run(["scancel", *jobs])


# --- an emulated multi-node cluster on this machine (testbed/) ---------------------------------
from testbed.cluster import EmulatedCluster  # noqa: E402
from testbed.system import Unavailable  # noqa: E402

CLUSTER_LINK = "1gbit"


def require_or_skip(reason: str) -> None:
    """Skip, except where the real test beds are required (CI: SUITE_REQUIRE_SLURM=1 or CI=true)."""
    if os.environ.get("SUITE_REQUIRE_SLURM") == "1" or os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"required in CI but {reason}", pytrace=False)
    pytest.skip(reason)


def start_or_skip(bed, what: str) -> None:
    """bed.start(), or skip saying why it cannot be provided here (a failure in CI)."""
    reason = None
    try:
        bed.start()
    except Unavailable as e:
        reason = f"no {what}: {e}"
    if reason is not None:      # outside the except: no chained traceback in the report
        require_or_skip(reason)


@pytest.fixture(scope="session")
def emulated_cluster() -> Iterator[EmulatedCluster]:
    """Two nodes (network namespaces node1, node2, a 1 Gbit/s shaped link) and a real Slurm across
    them, once per session (`make cluster-up` is the same code). Everything it made is removed at
    the end, also when a test fails or the session is interrupted; a session killed outright is
    cleaned up by the next start. Skips without root, except in CI where it must run."""
    cluster = EmulatedCluster(f"ci{os.getpid() % 10**6}", num_nodes=2, link=CLUSTER_LINK)
    start_or_skip(cluster, "emulated cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(emulated_cluster) -> Iterator[EmulatedCluster]:
    """The session's cluster for one test: its link back at CLUSTER_LINK and no job left after it."""
    yield emulated_cluster
    jobs = emulated_cluster.run(["squeue", "-h", "-o", "%A"], check=False).stdout.split()
    if jobs:
        emulated_cluster.run(["scancel", *jobs], check=False)
    if emulated_cluster.link != CLUSTER_LINK:
        emulated_cluster.shape(CLUSTER_LINK)


from testbed.postgres import PostgresServer  # noqa: E402


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL server (Debian's postgresql, installed when missing) on a free localhost
    port, once per session, stopped and removed at the end. Skips with the reason where it cannot be
    provided (not root and not installed, no apt-get), except in CI where it must run."""
    server = PostgresServer()
    start_or_skip(server, "PostgreSQL server")
    print(f"PostgreSQL started in {server.start_s:.1f} s"
          + (f" (apt-get install {server.install_s:.0f} s)" if server.install_s else ""))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_store(postgres_server, request) -> str:
    """The URL of a new empty database of the session's server, for one test."""
    import hashlib

    name = ("t_" + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:40] + "_"
            + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:8])
    return postgres_server.create_database(name)


@pytest.fixture(scope="session")
def chromium_browser() -> str:
    """Debian's chromium (installed when missing, as root): the binary the report tests open pages
    with (tests/browser.py). Skips with the reason where it cannot be provided, except in CI."""
    from ..browser import BrowserUnavailable, chromium

    try:
        return chromium()
    except BrowserUnavailable as e:
        require_or_skip(f"no chromium: {e}")
        raise
