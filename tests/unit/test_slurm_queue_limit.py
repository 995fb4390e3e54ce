"""platform.slurm.queue_limit_s without a cluster: SlurmLauncher.wait against a scripted queue and
clock. A job pending past the limit is cancelled and recorded with the limit and Slurm's reason; an
array task waiting only for its siblings' CPUs is not (the integration test does it for real:
tests/integration/test_slurm_collect.py)."""
from __future__ import annotations

import io

import pytest
from unit_helpers import REPO_ROOT

from harness.errors import ConfigError
from harness.record import status_of


class Queue:
    """squeue's answers, poll after poll: {job id: (state, reason)}; the harness's scancels."""

    def __init__(self, script):
        self.script = list(script)
        self.polls = 0
        self.cancelled: list[str] = []
        self.now = 0.0

    def states(self, bases):
        from harness.launch.slurm import JobInfo

        step = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        for j in self.cancelled:
            step = {**step, j: ("CANCELLED", step.get(j, ("", ""))[1])}
        return {j: JobInfo(j, state, reason, "n1" if state == "RUNNING" else "") for j, (state, reason) in step.items()}

    def final(self, job_id):
        from harness.launch.slurm import JobInfo

        return JobInfo(job_id, "CANCELLED" if job_id in self.cancelled else "COMPLETED")


@pytest.fixture
def scripted(monkeypatch, composed, tmp_path):
    from harness.launch import slurm
    from harness.plan import plan_run

    def make(script, limit):
        q = Queue(script)
        monkeypatch.setattr(slurm, "queue_states", q.states)
        monkeypatch.setattr(slurm, "final_state", q.final)
        monkeypatch.setattr(slurm, "cancel", lambda ids: q.cancelled.extend(ids))
        monkeypatch.setattr(slurm.time, "monotonic", lambda: q.now)
        monkeypatch.setattr(slurm.time, "sleep", lambda s: setattr(q, "now", q.now + s))
        cfg = composed(["platform=cpu", "platform.launcher=slurm", "platform.slurm.poll_s=1",
                        f"platform.slurm.queue_limit_s={limit}"])
        runs = [plan_run(cfg, f"r{i}", i, [], tmp_path / "out", REPO_ROOT, tmp_path / "cache") for i in range(2)]
        launcher = slurm.SlurmLauncher(cfg.platform, REPO_ROOT, tmp_path / "out", stream=io.StringIO())
        return q, runs, launcher
    return make


def test_a_job_pending_past_the_limit_is_cancelled_with_the_limit_and_reason_as_cause(scripted):
    q, (run, _), launcher = scripted([{"7": ("PENDING", "Resources")}], limit=10)
    launch = launcher.wait({"7": run})["7"]
    assert q.cancelled == ["7"] and 10 < q.now < 13
    assert launch.cause.startswith("slurm job 7 pending 1") and launch.job["state"] == "CANCELLED"
    assert "> platform.slurm.queue_limit_s=10 (reason: Resources); cancelled" in launch.cause
    status, reason = status_of(run, launch, [], [])
    assert status == "error" and "queue_limit_s=10" in reason


def test_array_tasks_waiting_for_their_siblings_are_not_past_the_limit(scripted):
    busy = {"5_0": ("RUNNING", ""), "5_1": ("PENDING", "Resources")}
    after = {"5_0": ("COMPLETED", ""), "5_1": ("PENDING", "Resources")}
    q, runs, launcher = scripted([busy] * 30 + [after], limit=10)  # task 1 waits 30 s behind task 0
    result = launcher.wait({"5_0": runs[0], "5_1": runs[1]})
    assert q.cancelled == ["5_1"]  # only once nothing of the array ran, 10 s later
    assert 40 < q.now < 43
    assert result["5_0"].cause is None and "queue_limit_s=10" in result["5_1"].cause


def test_without_a_limit_a_pending_job_is_waited_for(scripted):
    q, (run, _), launcher = scripted([{"7": ("PENDING", "Priority")}] * 100 + [{"7": ("COMPLETED", "")}], limit="null")
    launcher.wait({"7": run})
    assert q.cancelled == [] and q.now >= 100


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_queue_limit_must_be_positive(composed, value):
    with pytest.raises(ConfigError, match="platform.slurm.queue_limit_s"):
        composed(["platform.launcher=slurm", f"platform.slurm.queue_limit_s={value}"])
