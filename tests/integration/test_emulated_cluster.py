"""The emulated cluster itself (testbed/): real network namespaces, shaped links and a real Slurm with
one slurmd per node; what it leaves behind (nothing) when it stops, fails, is interrupted or killed;
and what it never touches (the root namespace, a Slurm already running there)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from testbed.cluster import BASE_DIR, PARTITION, EmulatedCluster, reap_stale
from testbed.network import netns_exists, payload_gbps
from testbed.system import Unavailable, cmdline, find_binary, pid_alive

from .conftest import REPO, wait_for

pytestmark = pytest.mark.cluster


def root_namespace() -> dict[str, str]:
    """What the root network namespace has: interfaces, addresses, routes, qdiscs."""
    snap = {}
    for what in (["link", "show"], ["addr", "show"], ["route", "show"], ["-6", "route", "show"]):
        out = subprocess.run([find_binary("ip"), "-j", *what], capture_output=True, text=True).stdout
        snap[" ".join(what)] = json.dumps([{k: v for k, v in e.items() if k not in ("stats", "stats64")}
                                           for e in json.loads(out or "[]")], sort_keys=True)
    snap["qdisc"] = subprocess.run([find_binary("tc"), "qdisc", "show"], capture_output=True, text=True).stdout
    return snap


def left_behind(name: str) -> list[str]:
    """Namespaces, processes and files of a cluster that should be gone."""
    root = BASE_DIR / name
    found = [ns for ns in (f"tb-{name}-sw", f"tb-{name}-node1", f"tb-{name}-node2") if netns_exists(ns)]
    found += [f"pid {p}: {cmdline(int(p))}" for p in os.listdir("/proc")
              if p.isdigit() and str(root) + "/" in cmdline(int(p))]
    return found + ([str(root)] if root.exists() else [])


def test_nodes_have_their_own_names_addresses_and_shaped_links(cluster):
    for k in (1, 2):
        assert cluster.run(["hostname"], node=k).stdout.strip() == f"node{k}"
        qdisc = json.loads(cluster.run(["tc", "-j", "qdisc", "show", "dev", "eth0"], node=k).stdout)
        assert qdisc[0]["kind"] == "tbf" and qdisc[0]["options"]["rate"] == 125_000_000   # bytes/s = 1 Gbit/s
    assert cluster.run(["getent", "hosts", "node2"], node=1).stdout.split()[0] == "10.213.0.2"
    assert cluster.payload_gbps == pytest.approx(0.9564, abs=1e-3)
    assert payload_gbps("250mbit") == pytest.approx(0.2391, abs=1e-3)


def test_a_batch_job_spans_both_nodes(cluster, tmp_path):
    out = tmp_path / "job.out"
    job = cluster.run(["sbatch", "--parsable", "--nodes=2", f"--output={out}", "--wrap",
                       "srun --nodes=2 --ntasks-per-node=1 hostname"]).stdout.strip()
    wait_for(lambda: not cluster.run(["squeue", "-h", "-j", job], check=False).stdout.strip(), 60, "the job to end")
    assert sorted(out.read_text().split()) == ["node1", "node2"]
    assert "JobState=COMPLETED" in cluster.run(["scontrol", "show", "job", job]).stdout


def test_the_client_script_runs_slurms_clients_on_node1_without_an_outer_jobs_variables(cluster):
    """The cpu-cluster platform's client_prefix (testbed/cluster.py CLIENT): node1, this cluster's
    SLURM_CONF, none of a surrounding job's Slurm input variables; its CPU cost a call is printed
    beside `python3 -m testbed exec`'s (what it replaced: a Python start at every poll)."""
    import resource

    env = {**os.environ, "SLURM_JOB_ID": "999", "SBATCH_PARTITION": "nope", "SQUEUE_FORMAT": "%i"}
    show = "hostname; env | grep -E '^(SLURM|SBATCH|SQUEUE)_' | sort; sinfo -h -o '%P %D'"
    out = subprocess.run([str(cluster.client), "sh", "-c", show], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["node1", f"SLURM_CONF={cluster.conf}", f"{PARTITION}* 2"], out.stdout

    def cpu_s(argv: list[str], calls: int = 5) -> float:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(calls):
            subprocess.run(argv, cwd=REPO, capture_output=True, check=True, timeout=30)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / calls

    squeue = ["squeue", "-h"]
    script = cpu_s([str(cluster.client), *squeue])
    python = cpu_s([sys.executable, "-m", "testbed", "exec", "--name", cluster.name, "--", *squeue])
    print(f"CPU seconds per squeue call: client script {script:.3f}, python3 -m testbed exec {python:.3f}")


def test_shaping_changes_the_rate_on_both_ends(cluster):
    cluster.shape("250mbit")
    node = json.loads(cluster.run(["tc", "-j", "qdisc", "show", "dev", "eth0"], node=2).stdout)
    switch = json.loads(subprocess.run([find_binary("tc"), "-n", cluster.network.switch, "-j", "qdisc", "show",
                                        "dev", "v2"], capture_output=True, text=True, check=True).stdout)
    assert node[0]["options"]["rate"] == switch[0]["options"]["rate"] == 31_250_000


def test_the_root_namespace_is_untouched_and_a_failing_user_leaves_nothing(emulated_cluster):
    before = root_namespace()
    name = f"rt{os.getpid() % 10**6}"
    with pytest.raises(RuntimeError, match="a test failing half-way"):
        with EmulatedCluster(name, num_nodes=2, link="500mbit") as c:
            assert root_namespace() == before
            assert c.run(["hostname"], node=2).stdout.strip() == "node2"
            raise RuntimeError("a test failing half-way")
    assert left_behind(name) == []
    assert root_namespace() == before


def test_a_slurm_in_the_root_namespace_keeps_working(slurm_cluster, emulated_cluster, tmp_path):
    """Both clusters up at once (the session's single-node Slurm runs in the root namespace): a job
    on each, and the root one's daemons untouched."""
    daemons = dict(slurm_cluster.daemon_pids)
    out = tmp_path / "root-job.out"
    job = slurm_cluster.run(["sbatch", "--parsable", f"--output={out}", "--wrap", "hostname"]).stdout.strip()
    slurm_cluster.wait_gone(job)
    assert out.read_text().strip() == os.uname().nodename.split(".")[0]
    assert emulated_cluster.run(["sinfo", "-h", "-o", "%D %T"]).stdout.split() == ["2", "idle"]
    assert slurm_cluster.daemon_pids == daemons


OWNER = """
import sys, time
from testbed.cluster import EmulatedCluster
c = EmulatedCluster(sys.argv[1], num_nodes=2, link="1gbit")
c.start()
try:  # the pids are printed inside: a Ctrl-C sent once they are read lands where `finally` runs
    print(" ".join(str(p) for p in c.daemons.values()), flush=True)
    time.sleep(600)
finally:
    c.stop()
"""


def _user_ctrl_c() -> None:
    """preexec_fn: the user's Ctrl-C as a terminal delivers it. A test session started in the
    background by a non-interactive shell (`nohup bash .ci/run &`) inherits SIGINT ignored, and
    Python then installs no KeyboardInterrupt handler: the SIGINT below would be lost and the owner
    would sleep on (what failed this test in every full run started that way, never alone)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_owner(name: str) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, name], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_user_ctrl_c)
    line = proc.stdout.readline()
    assert line.strip(), proc.stderr.read()
    return proc, [int(p) for p in line.split()]


def test_an_interrupted_user_tears_it_down(emulated_cluster):
    name = f"in{os.getpid() % 10**6}"
    proc, daemons = _start_owner(name)
    proc.send_signal(signal.SIGINT)   # Ctrl-C: KeyboardInterrupt, the `finally` stops the cluster
    _, err = proc.communicate(timeout=60)
    assert not any(pid_alive(p) for p in daemons), err
    assert left_behind(name) == [], err


def test_a_killed_user_is_cleaned_up_by_the_next_start(emulated_cluster):
    name = f"kl{os.getpid() % 10**6}"
    proc, daemons = _start_owner(name)
    proc.kill()   # no teardown at all
    proc.wait()
    wait_for(lambda: not any(pid_alive(p) for p in daemons), 15, "the daemons to die with their owner")
    assert netns_exists(f"tb-{name}-node1")          # what only the next start can remove
    assert name in reap_stale()
    assert left_behind(name) == []


def test_the_make_targets_bring_a_cluster_up_reshape_it_and_take_it_down(emulated_cluster):
    name = f"mk{os.getpid() % 10**6}"
    make = ["make", "-s", f"CLUSTER={name}", "PYTHON=" + sys.executable]
    try:
        up = subprocess.run([*make, "cluster-up", "NODES=2", "LINK=500mbit", "CLOCK_SKEW=1000"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "2 nodes (node1, node2), links 500mbit" in up.stdout
        assert "node K's monotonic clock (K-1) x 1000 s ahead" in up.stdout
        uptime = {k: float(subprocess.run([sys.executable, "-m", "testbed", "exec", "--name", name, "--node", str(k),
                                           "--", "cat", "/proc/uptime"], cwd=REPO, capture_output=True,
                                          text=True).stdout.split()[0]) for k in (1, 2)}
        assert 999 <= uptime[2] - uptime[1] <= 1001, uptime    # node2's boot clock 1000 s ahead, node1's not
        shaped = subprocess.run([*make, "cluster-shape", "LINK=250mbit"], cwd=REPO, capture_output=True, text=True)
        assert "links 250mbit" in shaped.stdout, shaped.stdout + shaped.stderr
        on_node2 = subprocess.run([sys.executable, "-m", "testbed", "exec", "--name", name, "--node", "2", "--",
                                   "hostname"], cwd=REPO, capture_output=True, text=True)
        assert on_node2.stdout.strip() == "node2"
        status = subprocess.run([*make, "cluster-status"], cwd=REPO, capture_output=True, text=True)
        assert "node1 idle, node2 idle" in status.stdout, status.stdout + status.stderr
    finally:
        down = subprocess.run([*make, "cluster-down"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0 and "stopped and removed" in down.stdout, down.stdout + down.stderr
    assert left_behind(name) == []
    again = subprocess.run([*make, "cluster-down"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_without_root_it_says_so_and_makes_nothing():
    if os.geteuid() != 0:
        proc = subprocess.run([sys.executable, "-m", "testbed", "up", "--name", "nr"], cwd=REPO,
                              capture_output=True, text=True)
    else:   # drop to nobody for the child
        setpriv = find_binary("setpriv")
        if setpriv is None:
            pytest.skip("no setpriv to drop root")
        proc = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                               "testbed", "up", "--name", "nr"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "needs root (CAP_NET_ADMIN" in proc.stderr
    assert not netns_exists("tb-nr-node1")


def test_bad_input_is_refused_with_what_is_valid():
    for args, message in ((["up", "--link", "fast"], "link rate 'fast' is not valid"),
                          (["up", "--link", "40gbit"], "shape between 1kbit and 2gbit"),
                          (["up", "--nodes", "0"], "a whole number of nodes from 1 to 64"),
                          (["up", "--clock-skew", "1.5"], "--clock-skew '1.5': whole seconds from 0 to 86400")):
        proc = subprocess.run([sys.executable, "-m", "testbed", *args, "--name", "bad"], cwd=REPO,
                              capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    with pytest.raises(Unavailable, match="no emulated cluster named 'absent' is up"):
        EmulatedCluster.load("absent")
