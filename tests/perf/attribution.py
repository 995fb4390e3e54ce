"""Attribution, measured (issue 16 item 4): does a verdict name the one thing that changed, and do
two unchanged runs stay quiet?

    .venv/bin/python tests/perf/attribution.py [--pairs 5] [--repeats 3] [--out DIR] [--only REGEX]   # make perf runs it

The corpus: one llama-tiny configuration (`bench suite=single`) run --repeats times as the OLD side,
then once per case with one change, judged as `compare NEW --against OLD` judges (harness.verdict.ab).
Cases run for real on the cpu platform where this box can make the change:
- a slowed micro-step (`measure.inject_delay_s`), expected `measure.inject_delay_s`;
- the thread count (`platform.cpu_threads=16`: 16 OpenMP threads per rank on the box's cores),
  expected `env.OMP_NUM_THREADS`;
- a busier machine (two busy-looping processes in a session of their own, as a neighbour logged
  in beside the run: the scheduler shares the CPUs between sessions), expected `load.other_cpus`,
  or "not comparable" because the probe saw the other work, or because it took the CPU time that
  explains the change (harness/verdict/explained.py at_cpu_share);
- a slower machine: torch's non-vectorised kernels (ATEN_CPU_CAPABILITY=default in the ranks'
  environment), expected "not comparable" naming the CPU capability;
- a shaped link: llama-tiny on the emulated cluster (testbed/: 2 network namespaces with their own
  hostnames, a Slurm job per run) at 1 Gbit/s, then after `testbed shape` to 100 Mbit/s, expected
  `links.<node>/eth0` of each node and nothing else (as root with Slurm installed; else skipped).
- a library change and an environment variable, each in a second image built from the same recipe
  (podman: `containers.recipes --move deepspeed==0.19.7`, `--env MALLOC_ARENA_MAX=2`), OLD in the
  lock's image, expected the image's tag and digest and `deepspeed` / `env.MALLOC_ARENA_MAX`, named by
  every verdict whatever it is (skipped without podman).
- the compiler (issue 38), llama-tiny compiled (`workload.compile=torch`: Inductor's C++ backend), OLD
  and NEW interleaved: Inductor's C++ kernels built unoptimised (TORCHINDUCTOR_DEBUG_COMPILE=1 in the
  ranks' environment: -O0; 3.0-3.8x slower on the 2-core EPYC), expected `env.TORCHINDUCTOR_DEBUG_COMPILE`;
  and torchao moved (0.18.0 -> 0.17.0, or absent -> 0.17.0) in a second venv over this one (the one
  package installed into it, pip --no-deps; the others through a .pth), expected `torchao`, named by
  every verdict whatever it is (no package of this layer moved measurably on cpu: sympy 1.14.0 ->
  1.13.3, Inductor's own, left a cold compile at 65-71 s; skipped when pip cannot fetch it).
Where it cannot (no second torch, DeepSpeed or transformers offline, no Triton or Liger Kernel on a
cpu box, no second SDPA backend choosing itself, no container engine, one CPU model), the change is
an edit of real records: NEW is another
set of unchanged runs whose fingerprint gets the change and whose throughput is slowed to
SLOWDOWN (the effect the changed component would have); a different CPU or core count is not
slowed and must read "not comparable"; a power-capped, a throttled and a PCIe-degraded GPU are
real `nvidia-smi -q` outputs (tests/data/nvidia_smi/, each cited) put in the probe of NEW, a healthy
GPU's in OLD's (the same GPU with its link at its max for the PCIe case), and must read "not
comparable" naming the power limit, the throttle reasons, the link.
A case is right when some verdict is a regression (or "not comparable" where expected) and every
regression's "what changed" names exactly the expected keys, nothing else, nothing missing (beside
the machine as measured around the run: TRUE_BYSTANDERS); a "not comparable" beside such a
regression is the machine measured otherwise (a busy neighbour), no wrong attribution.

False alarms: --pairs + 1 runs of the default cpu suite back to back; each consecutive pair
compared (the later --against the earlier) under compare's rules. A pair with any regression is a
false alarm; also printed: how many configurations moved beyond their tolerance (what a judge that
trusted one run a side would have flagged). Targets (issue 16): >= 90 % of >= 10 cases right, at
most 1 false alarm in >= 5 pairs. Exit status 0 whatever the figures, unless --check is given and a
target is missed.
"""
from __future__ import annotations

import argparse
import copy
import fnmatch
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.node.gpu_state import parse_query  # noqa: E402
from benchmarks.node.probe import PROBE_DIR  # noqa: E402
from harness.verdict.ab import references_of  # noqa: E402
from harness.verdict.compare import compare, load_records  # noqa: E402
from harness.record import ResultRecord  # noqa: E402
from harness.verdict.references import load_references  # noqa: E402

SLOWDOWN = 0.6
"""Throughput of an edited case's NEW side against its own measurement (1.67x slower)."""
BASE = ["suite=single", "history=none"]
HOST = socket.gethostname()
HIGHER = ("samples_per_s", "tokens_per_s", "mfu_pct", "mfu_with_teacher_pct", "matmul_eff_pct")


@dataclass
class Case:
    name: str
    expected: set[str]
    """The keys "what changed" must name; empty when the verdict must be "not comparable"."""
    overrides: list[str] = field(default_factory=list)
    neighbours: int = 0
    edit: Optional[Callable[[dict[str, Any]], None]] = None
    edit_old: Optional[Callable[[dict[str, Any]], None]] = None
    slow: bool = True
    cluster: Optional[tuple[str, str]] = None
    """(link before, link after) of a case run on the emulated cluster (testbed/, as root)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the NEW side's bench (and so of its ranks)."""
    reason: Optional[str] = None
    """A regular expression a "not comparable" verdict's reason must match to name the cause: with
    expected keys, either that verdict or a regression naming them is right; alone, the verdict must
    be "not comparable" with it."""

    image: Optional[tuple[list[str], list[str]]] = None
    """A case run in two images (podman): (`python -m containers.recipes` arguments of OLD's image,
    of NEW's), each built when missing; OLD is --repeats runs in the first, NEW in the second, and
    the case is right when every verdict that judged, whatever it is, names exactly the expected keys
    (a real library or environment change need not be slower; one the machine's measured state kept
    from judging, "not comparable", names nothing)."""

    base: list[str] = field(default_factory=list)
    """Overrides of both sides (a compiled configuration): such a case runs its own OLD side,
    interleaved with NEW so that drift hits both."""
    runs: Optional[int] = None
    """NEW's runs of a real case (default --repeats): one suffices for a change far beyond the noise
    (OLD's repeats judge it) or one the probe names."""
    moved: Optional[str] = None
    """A requirement (`torchao==0.17.0`): NEW runs in a second venv over this one in which that one
    package is installed (overlay_venv), OLD in this venv; judged as an image case."""

    @property
    def real(self) -> bool:
        return self.edit is None


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of the record's environment at a dotted path (each node's machine too, for machine.*)."""
    def edit(rec: dict[str, Any]) -> None:
        env = rec["environment"]
        targets = [env] + ([n for n in env.get("nodes") or []] if path.startswith("machine.") else [])
        for target in targets:
            *parents, leaf = path.split(".")
            for p in parents:
                target = target.setdefault(p, {})
            target[leaf] = value
    return edit


NVIDIA_SMI = REPO_ROOT / "tests" / "data" / "nvidia_smi"
"""Real `nvidia-smi -q` outputs posted publicly (each cited in its SOURCES.md)."""
GPU_NAME = "NVIDIA H100 80GB HBM3"


def _gpu_state(fixture: str, gpu: int = 0, **heal: str) -> Callable[[dict[str, Any]], None]:
    """An edit: each node's probe becomes a GPU node's whose `nvidia-smi -q` reads as FIXTURE's GPU
    (with `heal`: each named field set to the value of another field of the same GPU, e.g. the PCIe
    width at its max: the same GPU, healthy). The GPU's model is the same on both sides of a case."""
    def edit(rec: dict[str, Any]) -> None:
        state = parse_query((NVIDIA_SMI / fixture).read_text(encoding="utf-8"))[gpu]
        state.update({k: state[v] for k, v in heal.items()})
        env = rec["environment"]
        for machine in [env.get("machine")] + [n.get("machine") for n in env.get("nodes") or []]:
            if isinstance(machine, dict) and isinstance(machine.get("probe"), dict):
                machine["probe"].update(device="cuda", gpu_name=GPU_NAME, gpus=[state])
    return edit


def _both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(rec: dict[str, Any]) -> None:
        for e in edits:
            e(rec)
    return edit


COMPILED = ["workload.compile=torch", "measure.compile_cache=warm"]
"""llama-tiny compiled with Inductor (its C++ backend on cpu; a first compile 65-85 s on 2 cores, 9-12 s
with Inductor's caches warm). The corpus judges the measured steps, not the compilation: its repeats load
what the first compiled (a changed Inductor setting or package compiles anew anyway, its cache key moved)."""

MEMORY_BREAKDOWN = REPO_ROOT / "tests" / "data" / "deepspeed" / "memory_breakdown.json"
"""{"memory_breakdown": true}: DeepSpeed's see_memory_usage, forced, around every forward, backward and step
(gc.collect() and a log line each): llama-tiny ZeRO-1 on 2 cores 40.5 -> 3.2 samples/s."""

CASES = [
    Case("slowed micro-step (measure.inject_delay_s=0.1)", {"measure.inject_delay_s"},
         overrides=["measure.inject_delay_s=0.1"]),
    Case("thread count (platform.cpu_threads=16)", {"env.OMP_NUM_THREADS"}, overrides=["platform.cpu_threads=16"]),
    Case("busier machine (2 busy processes in another session)", {"load.other_cpus"}, neighbours=2,
         reason=r"other work (during the probe [\d.]+ vs [\d.]+ CPUs \(busier here\)|took [\d.]+ of the machine's \d+ CPUs)"),
    Case("torch's non-vectorised kernels (ATEN_CPU_CAPABILITY=default)", set(), env={"ATEN_CPU_CAPABILITY": "default"},
         reason=r"CPU capability DEFAULT, ATEN_CPU_CAPABILITY=default"),
    Case("another torch", {"torch"}, edit=_set("torch", "2.12.1+cpu")),
    Case("another DeepSpeed", {"deepspeed"}, edit=_set("deepspeed", "0.19.7")),
    Case("another transformers", {"transformers"}, edit=_set("transformers", "5.22.0")),
    Case("an NCCL variable (NCCL_ALGO=Tree)", {"env.NCCL_ALGO"}, edit=_set("env.NCCL_ALGO", "Tree")),
    Case("a gloo variable (GLOO_SOCKET_IFNAME=eth0)", {"env.GLOO_SOCKET_IFNAME"},
         edit=_set("env.GLOO_SOCKET_IFNAME", "eth0")),
    Case("another Triton", {"triton"}, edit=_set("triton", "3.5.1")),
    Case("another Liger Kernel", {"liger_kernel"}, edit=_set("liger_kernel", "0.8.4")),
    Case("another torchao", {"torchao"}, edit=_set("torchao", "0.17.0")),
    Case("another SDPA backend ran (stack.attention_used flash -> math)", {"stack.attention_used"},
         edit=_set("stack.attention_used", ["math"])),
    Case("Inductor's C++ kernels unoptimised (TORCHINDUCTOR_DEBUG_COMPILE=1, compiled)",
         {"env.TORCHINDUCTOR_DEBUG_COMPILE"}, base=COMPILED, env={"TORCHINDUCTOR_DEBUG_COMPILE": "1"}),
    Case("another torchao, in a second venv (torchao -> 0.17.0, compiled)", {"torchao"}, base=COMPILED,
         moved="torchao==0.17.0"),
    Case("DeepSpeed's memory_breakdown left on in the user's JSON (deepspeed_config=, run for real)",
         {"deepspeed.memory_breakdown"}, overrides=[f"deepspeed_config={MEMORY_BREAKDOWN}"]),
    Case("another container image", {"container_image"},
         edit=_set("container_image", "ghcr.io/example/llm-bench:cpu-2026.10")),
    Case("another DeepSpeed, in a second image (deepspeed 0.19.8 -> 0.19.7, podman)",
         {"deepspeed", "container_image", "container_digest"}, image=([], ["--move", "deepspeed==0.19.7"])),
    Case("an environment variable set in the image (ENV MALLOC_ARENA_MAX=2, podman)",
         {"env.MALLOC_ARENA_MAX", "container_image", "container_digest"}, image=([], ["--env", "MALLOC_ARENA_MAX=2"])),
    Case("a shaped link on the emulated cluster (1 Gbit/s -> 100 Mbit/s)", {"links.*/eth0"}, cluster=("1gbit", "100mbit")),
    Case("a shaped link (eth0 10 -> 1 Gbit/s)", {f"links.{HOST}/eth0"},
         edit=_set("links", {f"{HOST}/eth0": 0.125}), edit_old=_set("links", {f"{HOST}/eth0": 1.25})),
    Case("a power-capped GPU (nvidia-smi -q: 500 W of 700)", set(), reason=r"GPU power limit 500 vs 700 W",
         edit=_gpu_state("power_capped_595.71.05.txt"), edit_old=_gpu_state("h100_535.183.01_two_gpus.txt")),
    Case("a throttled GPU (nvidia-smi -q: HW Slowdown, HW Power Brake)", set(),
         reason=r"SM clock 86 vs \d+ MHz; throttled now: HW Slowdown",
         edit=_gpu_state("h100_535.161.08_hw_power_brake.txt"), edit_old=_gpu_state("h100_535.183.01_two_gpus.txt")),
    Case("a PCIe link trained at x8 (nvidia-smi -q: Gen4 x8 of x16)", set(), reason=r"PCIe link Gen4 x8 vs Gen4 x16",
         edit=_gpu_state("a10g_535.247.01_pcie_x8.txt"),
         edit_old=_gpu_state("a10g_535.247.01_pcie_x8.txt", pcie_width_current="pcie_width_max")),
    Case("a different CPU", set(), edit=_set("machine.cpu.model", "Intel Xeon Gold 6338"), slow=False),
    Case("more cores", set(), edit=_set("machine.cpu.logical_cpus", 8), slow=False),
]


def bench(out: Path, overrides: list[str], neighbours: int = 0, env: Optional[dict[str, str]] = None,
          python: str = sys.executable, probe_from: Optional[Path] = None) -> int:
    """One `bench` of the harness (its ranks in `python`'s venv); `neighbours` busy-looping processes
    run beside it. With `probe_from` (an earlier bench's folder), the bench reads that bench's probe
    instead of measuring its own (benchmarks/node/probe.py node_probe: a bench's probe is measured
    once, by its first run): both then carry one measurement of the machine, and what the machine
    did during each run is their pulses' to say (the pace rule)."""
    if probe_from is not None and (probe_from / PROBE_DIR).is_dir():
        shutil.copytree(probe_from / PROBE_DIR, out / PROBE_DIR, dirs_exist_ok=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(neighbours)]
    try:
        with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
            return subprocess.run([python, "-m", "harness", "bench", "confirm_regressions=0", f"out={out}", *overrides],
                                  cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})}).returncode
    finally:
        for p in busy:
            p.kill()
            p.wait()


CLUSTER = "attribution"


def on_cluster(work: Path, repeats: int, extra: list[str], before: str, after: str
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OLD and NEW of llama-tiny on the emulated cluster (2 nodes x 1 gloo rank, Slurm jobs): OLD
    on the `before` link, NEW after `testbed shape` to `after`; the cluster is taken down after."""
    testbed = [sys.executable, "-m", "testbed"]
    env = {**os.environ, "SUITE_CLUSTER": CLUSTER}
    subprocess.run(testbed + ["up", "--name", CLUSTER, "--nodes", "2", "--link", before], cwd=REPO_ROOT,
                   check=True, capture_output=True, text=True)
    try:
        sides: dict[str, list[str]] = {"old": [], "new": []}
        for side, link in (("old", before), ("new", after)):
            if side == "new":
                subprocess.run(testbed + ["shape", "--name", CLUSTER, "--link", link], cwd=REPO_ROOT, check=True,
                               capture_output=True, text=True)
            for i in range(repeats):
                out = work / f"{side}-{i}"
                out.parent.mkdir(parents=True, exist_ok=True)
                with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
                    subprocess.run([sys.executable, "-m", "harness", "bench", "confirm_regressions=0", "platform=cpu-cluster", f"out={out}",
                                    *BASE, *extra], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
                sides[side].append(str(out))
        return _load(sides["old"]), _load(sides["new"])
    finally:
        subprocess.run(testbed + ["down", "--name", CLUSTER], cwd=REPO_ROOT, capture_output=True, text=True)


def in_images(work: Path, repeats: int, extra: list[str], old_args: list[str], new_args: list[str]
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OLD and NEW of the case, each side's ranks in its own image (built by containers.recipes
    when missing: the layer cache makes a built one seconds), interleaved so drift hits both."""
    tags = []
    for args in (old_args, new_args):
        done = subprocess.run([sys.executable, "-m", "containers.recipes", "--image", "cpu", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True)
        built = re.findall(r"^built (\S+):", done.stdout, flags=re.M)
        if done.returncode != 0 or not built:
            raise SystemExit(f"building the image ({' '.join(args) or 'the lock'}) failed:\n{done.stderr[-2000:]}")
        tags.append(built[-1])
    sides: dict[str, list[str]] = {"old": [], "new": []}
    for i in range(repeats):
        for side, tag in zip(("old", "new"), tags):
            out = work / f"{side}-{i}"
            out.parent.mkdir(parents=True, exist_ok=True)
            bench(out, BASE + extra + ["platform.container.runtime=podman", f"platform.container.image={tag}"])
            sides[side].append(str(out))
    return _load(sides["old"]), _load(sides["new"])


def interleaved(work: Path, repeats: int, runs: int, old: list[str], new: list[str], env: dict[str, str],
                python: str = sys.executable) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """OLD (`old` overrides, --repeats runs) and NEW (`new`, with `env`, in `python`'s venv; `runs`
    runs), one of each in turn so that drift hits both; every bench reads the first one's probe, so
    a neighbour that comes and goes between benches moves their pulses, not a probe apart."""
    sides: dict[str, list[str]] = {"old": [], "new": []}
    for i in range(max(repeats, runs)):
        for side, args, side_env, py, n in (("old", old, {}, sys.executable, repeats),
                                            ("new", new, env, python, runs)):
            if i < n:
                out = work / f"{side}-{i}"
                out.parent.mkdir(parents=True, exist_ok=True)
                first = Path(sides["old"][0]) if sides["old"] else None   # one probe for the case's benches
                bench(out, args, env=side_env, python=py, probe_from=first)
                sides[side].append(str(out))
    return _load(sides["old"]), _load(sides["new"])


def overlay_venv(venv: Path, requirement: str) -> Optional[str]:
    """A second venv over this one: its own site-packages first, holding `requirement` alone (pip
    --no-deps), then this venv's (a .pth adds it as a site directory, its own .pth files read), so
    every other package is this venv's. Its python, or None when pip could not install it (offline)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    ours = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    theirs = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    Path(theirs, "_over_base_venv.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ours), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", theirs,
                           "--upgrade", requirement], capture_output=True, text=True)
    return str(python) if done.returncode == 0 else None


def _load(paths: list[str]) -> list[dict[str, Any]]:
    """Records as dicts, for the cases to edit."""
    return [r.to_dict() for r in load_records(paths)]


def _installed(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _typed(records: list[dict[str, Any]]) -> list[ResultRecord]:
    """Edited records, validated again, as compare takes them."""
    return [ResultRecord.from_dict(r, f"record {r.get('run_id')}") for r in records]


def slowed(rec: dict[str, Any], factor: float) -> dict[str, Any]:
    rec = copy.deepcopy(rec)
    for name, m in rec["metrics"].items():
        if name in HIGHER:
            m["value"] *= factor
        elif name == "step_time_s":
            m["value"] /= factor
    return rec


def _copy_of(rec: dict[str, Any], i: int) -> dict[str, Any]:
    out = copy.deepcopy(rec)
    out["run_id"] = f"{rec['run_id']}-{i}" if i else rec["run_id"]
    return out


def edited(case: Case, old: list[dict[str, Any]], same: list[dict[str, Any]], shared_state: bool
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(OLD, NEW) of an edited case: NEW is `same` (slowed where the case is a slowdown) with the case's
    edit. With shared_state, both sides are copies of OLD's first run, its machine state and its
    figures: the edit (and the slowdown) is all that differs between them. Two OLD runs of a busy box
    can lie 2x apart, and then neither a verdict nor an interval holds: their machine states made the
    pace rule read "not comparable", and their figures' spread made every edited case "insufficient
    data" (the bootstrap pairs the sides' samples at random)."""
    if shared_state:   # every copy carries the first run's machine state (load and pulses, probe, nodes)
        old = same = [_copy_of(old[0], i) for i in range(len(old))]
    new = [slowed(r, SLOWDOWN) if case.slow else copy.deepcopy(r) for r in same]
    base = copy.deepcopy(old)
    for r in new:
        case.edit(r)
    for r in base:
        (case.edit_old or (lambda _: None))(r)
    return base, new


@dataclass
class Outcome:
    case: Case
    right: bool
    verdicts: str
    named: list[str]


TRUE_BYSTANDERS = ("load.other_cpus", "load.steal_cpus", "load.pulse_exchange_us", "load.straggler",
                   "load.pulse_devices", "probe.*")
"""Keys a diff may name beside the expected ones: the machine as measured around the run: other work
on the box during it, the CPUs' worth the VM's hypervisor took from it (steal), the host's exchange latency
(a slow spell at either end of one side's run: about one round in eight on the Zen 5), the rank the others
waited for, a device slower than the rest read at once, and the probe's figures that moved beyond their tolerance
before it (a neighbour, the VM's host:
`probe.fp32_matmul_gflops`).
Each is true when named (a concurrent process in CI did run; in CI on 2026-12-03 the host took ~0.7 of
the 2-core box's CPUs, and the memory_breakdown case's regression named `deepspeed.memory_breakdown,
load.steal_cpus`), and a real load must not fail a case that checks the attribution of something else."""


def names_exactly(diff: dict[str, Any], expected: set[str]) -> bool:
    """Every key of the diff is an expected one (fnmatch patterns: `links.*/eth0` for each node's
    link) or a measured bystander (TRUE_BYSTANDERS), and every expected one is there."""
    allowed = expected | set(TRUE_BYSTANDERS)
    return bool(diff) and all(any(fnmatch.fnmatchcase(k, e) for e in allowed) for k in diff) \
        and all(any(fnmatch.fnmatchcase(k, e) for k in diff) for e in expected)


def judge(case: Case, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> Outcome:
    verdicts = compare(_typed(new), references_of(_typed(old)))
    flagged = [v for v in verdicts if v.verdict in ("regression", "not comparable")]
    named = sorted({json.dumps(sorted(v.environment_diff)) for v in flagged if v.verdict == "regression"})
    named += sorted({v.reason for v in flagged if v.verdict == "not comparable"})
    kinds = sorted({v.verdict for v in verdicts})

    # a regression naming exactly the cause: the machine measured otherwise than OLD's beside it (a busy
    # neighbour; "not comparable" for the metrics that move with its speed) attributes nothing wrongly
    named_right = bool(case.expected) and any(names_exactly(v.environment_diff, case.expected)
                                              for v in flagged if v.verdict == "regression")

    def right_one(v) -> bool:
        if case.reason and re.search(case.reason, v.reason):   # the cause in words (an efficiency across machines too)
            return True
        if v.verdict == "not comparable":
            return (not case.expected and case.reason is None) or named_right
        return bool(case.expected) and names_exactly(v.environment_diff, case.expected)
    if case.image or case.moved:   # whatever the verdicts: each that judged names exactly what changed
        judged = [v for v in verdicts if v.environment_diff]
        right = bool(judged) and all(names_exactly(v.environment_diff, case.expected) for v in judged)
        named = sorted({json.dumps(sorted(v.environment_diff)) for v in judged})
        return Outcome(case, right, "/".join(kinds), [", ".join(json.loads(n)) for n in named])
    right = bool(flagged) and all(right_one(v) for v in flagged)
    return Outcome(case, right, "/".join(kinds), [n if n.startswith("not comparable") else
                                                  (", ".join(json.loads(n)) or "nothing") for n in named])


def corpus(work: Path, repeats: int, cases: list[Case] = CASES, extra: Optional[list[str]] = None,
           edit_source: str = "same") -> list[Outcome]:
    """Run the OLD side and every case; judge each (printed as it goes). An edited case's NEW side
    is another set of unchanged runs ("same", run interleaved with OLD), or OLD's own records ("old":
    no noise between the sides, and one machine state on both (edited), so the check
    does not depend on this machine's steadiness nor on a neighbour's load between the OLD runs)."""
    extra = list(extra or [])
    sides: dict[str, list[Path]] = {"old": [], "same": []}
    if any(not (c.cluster or c.image or c.base) for c in cases):   # the shared OLD side, for the cases that use it
        for i in range(repeats):   # OLD and the unchanged NEW interleaved, so drift hits both
            for side in ("old", "same") if edit_source == "same" else ("old",):
                out = work / f"{side}-{i}"
                if bench(out, BASE + extra, probe_from=None if (side, i) == ("old", 0) else work / "old-0") not in (0,):
                    raise SystemExit(f"the {side} bench failed: see {out}.log")
                sides[side].append(out)
    old = _load([str(p) for p in sides["old"]]) if sides["old"] else []
    same = _load([str(p) for p in sides["same"]]) if edit_source == "same" and sides["same"] else old
    outcomes = []
    for n, case in enumerate(cases):
        if case.cluster:
            if os.geteuid() != 0 or shutil.which("slurmctld") is None:
                print(f"  skipped: {case.name}: needs root and Slurm (the emulated cluster)", flush=True)
                continue
            base, new = on_cluster(work / f"case{n}", repeats, extra, *case.cluster)
        elif case.image:
            if shutil.which("podman") is None:
                print(f"  skipped: {case.name}: needs podman (make containers)", flush=True)
                continue
            base, new = in_images(work / f"case{n}", repeats, extra, *case.image)
        elif case.moved:
            name, _, version = case.moved.partition("==")
            python = None if _installed(name) == version else overlay_venv(work / f"case{n}" / "venv", case.moved)
            if python is None:
                print(f"  skipped: {case.name}: {name} is {version} here already, or pip could not install "
                      f"{case.moved}", flush=True)
                continue
            args = BASE + extra + case.base
            base, new = interleaved(work / f"case{n}", repeats, case.runs or repeats, args, args, {}, python)
        elif case.base:
            args = BASE + extra + case.base
            base, new = interleaved(work / f"case{n}", repeats, case.runs or repeats, args, args + case.overrides,
                                    case.env)
        elif case.real:
            outs = []
            # the OLD side's probe, unless the case's cause is the probe's to see (CPU capability, other work)
            shared = work / "old-0" if case.reason is None else None
            for i in range(case.runs or repeats):
                out = work / f"case{n}-{i}"
                bench(out, BASE + extra + case.overrides, case.neighbours, case.env, probe_from=shared)
                outs.append(str(out))
            new, base = _load(outs), old
        else:
            base, new = edited(case, old, same, shared_state=edit_source == "old")
        outcome = judge(case, base, new)
        print(f"  {'right' if outcome.right else 'WRONG'}: {case.name} ({'run' if case.real else 'edited records'}): "
              f"{outcome.verdicts}; what changed: {'; '.join(outcome.named) or '-'}", flush=True)
        outcomes.append(outcome)
    return outcomes


def false_alarms(work: Path, pairs: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Per consecutive pair of default cpu suites: (regressions, verdicts beyond tolerance, verdicts);
    and per suite, its regressions against the shipped references of this machine (what `bench`
    prints on an unchanged box; none when reference_results/ has no reference taken here)."""
    shipped = [r for r in load_references() if r.platform == "cpu"]
    runs, out, against_refs = [], [], []
    for i in range(pairs + 1):
        path = work / f"suite-{i}"
        bench(path, ["history=none"])
        runs.append(_load([str(path)]))
        against_refs.append(sum(v.verdict == "regression" for v in compare(_typed(runs[i]), shipped)))
        if i:
            verdicts = compare(_typed(runs[i]), references_of(_typed(runs[i - 1])))
            regressions = [v for v in verdicts if v.verdict == "regression"]
            beyond = [v for v in verdicts if v.worse_pct is not None and v.tolerance_pct is not None
                      and abs(v.worse_pct) > v.tolerance_pct]
            out.append((len(regressions), len(beyond), len(verdicts)))
            print(f"  pair {i}: {len(regressions)} regression(s); {len(beyond)} of {len(verdicts)} verdicts beyond "
                  f"tolerance ({', '.join(sorted({f'{v.benchmark} {v.metric}' for v in beyond})) or 'none'}); "
                  f"against reference_results/: {against_refs[i]} regression(s)", flush=True)
    return out, against_refs


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--only", default=None, metavar="REGEX", help="only the cases whose name matches")
    ns = parser.parse_args(argv)
    cases = [c for c in CASES if ns.only is None or re.search(ns.only, c.name)]
    if not cases:
        parser.error(f"--only {ns.only!r} matches no case")
    work = ns.out or Path(tempfile.mkdtemp(prefix="attribution-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"attribution corpus ({len(cases)} cases, {ns.repeats} runs a side) in {work}:", flush=True)
    outcomes = corpus(work, ns.repeats, cases)
    right = sum(o.right for o in outcomes)
    real = [o for o in outcomes if o.case.real]
    print(f"false alarms ({ns.pairs} pairs of default cpu suites back to back):", flush=True)
    pairs, against_refs = false_alarms(work, ns.pairs) if ns.pairs else ([], [])
    alarms = sum(1 for r, _, _ in pairs if r)
    print(f"\nattribution: {right} of {len(outcomes)} cases right ({100 * right / max(1, len(outcomes)):.0f} %; run for real: "
          f"{sum(o.right for o in real)} of {len(real)}; target >= 90 % of >= 10)")
    if pairs:
        beyond = sum(b for _, b, _ in pairs)
        print(f"false alarms: {alarms} of {len(pairs)} pairs (target <= 1 of >= 5; one run a side, compare calls no "
              f"regression by design); verdicts beyond tolerance, one run a side: {beyond} of "
              f"{sum(n for _, _, n in pairs)} in {sum(1 for _, b, _ in pairs if b)} pair(s); suites with a regression "
              f"against reference_results/: {sum(1 for r in against_refs if r)} of {len(against_refs)}")
    missed = right < 0.9 * len(outcomes) or len(outcomes) < 10 or (pairs and (alarms > 1 or len(pairs) < 5))
    return 1 if ns.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
