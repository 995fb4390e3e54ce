"""Units of work of `make test`'s second integration phase (`-p tests.integration.units --dist loadfile -n 2`):
pytest-xdist's loadfile scheduling (one test module a unit, its module fixtures built once), except that the
modules of ONE_WORKER are one unit together. xdist's own grouping (`--dist loadgroup`, marker xdist_group) does
nothing under pytest 9.2: xdist 3.8 renames each grouped item's `_nodeid`, which pytest 9 no longer reads (it
keeps `_id`), so every test was its own unit and two workers each started a Slurm. A plugin named on the command
line is loaded by the controller process too, which is the one that schedules.

It also keeps the phase's failures (--failed-to FILE: their node ids, one a line, written by the controller) and
runs just those again (--only-from FILE): make test runs a test that failed beside another worker once more, alone,
and the phase fails only if it fails alone too. These modules measure nothing, but a neighbour on 2 cores still
halves the pace of every process they start and wait on (a Slurm job's first step, an image build beside both)."""
from __future__ import annotations

from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

BACKGROUND_USER = "test_image"
"""Takes the background job's result (the image's first build): last of ONE_WORKER's unit."""
ONE_WORKER = ("test_slurm", "test_slurm_cluster", "test_slurm_collect", "test_slurm_tune", BACKGROUND_USER)
"""One unit, on one worker, in this order: the session's one real Slurm (slurm_cluster; another worker would start
a second on the same ports), then the image's tests, whose first build that worker starts in its background with
the first of them. The unit leads the queue: the longest, started first."""
GROUP = "one-worker"
LONGEST = ("test_tune", "test_gpu_check", "test_data_and_user_config", "test_op_locks", "test_reduce_scatter",
           "test_offload")
"""The other modules that take longest (each 170-500 s two at a time on a 2-core AVX2 EPYC, where ONE_WORKER's unit
took ~970 s), queued next, longest first: a long unit taken last would leave the other worker idle until it ends."""


def module_of(nodeid: str) -> str:
    """A test's module name from its node id (tests/integration/test_x.py::test_y -> test_x)."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


class ModuleUnits(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return GROUP if module_of(nodeid) in ONE_WORKER else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadfile":
        return ModuleUnits(config, log)
    return None


def pytest_addoption(parser):
    group = parser.getgroup("units", "make test's integration phases (tests/integration/units.py)")
    group.addoption("--failed-to", metavar="FILE", help="write the node ids of the tests that failed (setup, call or "
                    "teardown) to FILE, one a line; an empty FILE when none did")
    group.addoption("--only-from", metavar="FILE", help="run only the tests whose node ids FILE lists, one a line")


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    listed = config.getoption("only_from")
    if not listed:
        return
    wanted = set(Path(listed).read_text().splitlines())
    kept = [i for i in items if i.nodeid in wanted]
    config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in wanted])
    items[:] = kept


class FailedTo:
    """The controller's record of the failed tests (a worker's reports reach it through xdist)."""

    def __init__(self, path: Path):
        self.path, self.failed = path, []

    def pytest_runtest_logreport(self, report):
        if report.failed and report.nodeid not in self.failed:
            self.failed.append(report.nodeid)

    def pytest_sessionfinish(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(f"{n}\n" for n in self.failed))


def pytest_configure(config):
    path = config.getoption("failed_to")
    if path and _controller(config):
        config.pluginmanager.register(FailedTo(Path(path)), "units-failed-to")
