"""Units of work of `make test`'s second integration phase (`-p tests.integration.units --dist loadfile -n 2`):
pytest-xdist's loadfile scheduling (one test module a unit, its module fixtures built once), except that the
modules of ONE_WORKER are one unit together. xdist's own grouping (`--dist loadgroup`, marker xdist_group) does
nothing under pytest 9.2: xdist 3.8 renames each grouped item's `_nodeid`, which pytest 9 no longer reads (it
keeps `_id`), so every test was its own unit and two workers each started a Slurm. A plugin named on the command
line is loaded by the controller process too, which is the one that schedules."""
from __future__ import annotations

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
