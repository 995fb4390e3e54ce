"""Two machines: whether a reference's machine can judge a run's, the two named, and what a set of
verdicts across two machines says in one line.

A reference judges a run's speed only on the same machine: the same platform, and where the run
carries a capability probe the two probes agree (harness/probe.py not_comparable), else the machines'
names (machine_of). Runs of one configuration on two platforms (an H100's gpu-check against an H200's)
pair all the same (harness/verdict/compare.py pairing): their throughput and times are "not
comparable", the ratio shown as information, and the efficiencies against each machine's own measured
matmul rates (compare.ACROSS_MACHINES) are judged across them, within what the machines' balance of
matmul rate and memory bandwidth allows (explained.at_balance). `machine_pairs` sums a comparison up
per pair of machines: the geometric mean over the paired configurations of now/reference of the
throughput and of each efficiency (with the range the balance allows), and whether the configurations
rank alike by throughput on both.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Collection, Optional

from benchmarks.node.machine import cpu, cpu_kind   # the probe's own readers: what a run here would record
from benchmarks.node.probe import isa
from contract.fingerprint import OUTPUT_MACHINE
from contract.metrics import METRICS

from ..probe import PACE_NOISE_PCT, node_probes, not_comparable, probe_distance
from .changes import hardware

SPEED_METRICS = ("samples_per_s", "avg_busbw_gbps", "shared_busbw_gbps", "tokens_per_s")
"""The throughput a pair of machines is summed up by: the first of these its paired rows hold."""


def machine_of(env: Optional[dict[str, Any]]) -> Optional[str]:
    """What a measurement's speed rests on, from the fingerprint's machine (rank 0's node): the
    GPUs' model and count when it has GPUs, else the CPU's model and usable CPUs; None when the
    fingerprint does not say (a reference recorded before the machine was read, or one whose CPU
    model was only the architecture, 'x86_64'), and then nothing is concluded from it."""
    machine = (env or {}).get("machine") if isinstance(env, dict) else None
    if not isinstance(machine, dict) or not isinstance(machine.get("cpu") or {}, dict) \
            or not isinstance(machine.get("gpus") or [], list) or not all(isinstance(g, dict) for g in machine.get("gpus") or []):
        return None   # malformed (a hand-edited record): nothing concluded from it
    hw = hardware(machine)
    if hw["gpu_model"]:
        return f"{hw['gpu_count']} x {hw['gpu_model']}"
    model = hw["cpu_model"]
    if not model or model in ("x86_64", "aarch64", "arm64", "ppc64le", "s390x"):
        return None
    return f"{model} ({hw['logical_cpus']} CPUs)"


def machines_apart(reference_env: Optional[dict[str, Any]], current_env: dict[str, Any],
                   dtypes: Optional[Collection[str]] = None) -> Optional[str]:
    """'not comparable: ...' when the reference's machine cannot judge this run's, else None: by the
    two capability probes where this run has one (harness/probe.py; their matmul rates in `dtypes`,
    what the run computes in, all where None), and by the machines' names (a name alike proves
    nothing; names that differ are two machines)."""
    taken_on, run_on = machine_of(reference_env), machine_of(current_env)
    named = (f"reference taken on {taken_on}, this run on {run_on}"
             if taken_on and run_on and taken_on != run_on else None)
    kinds = kind_of(reference_env), kind_of(current_env)
    if not named and all(kinds) and kinds[0] != kinds[1]:   # one CPU name over two kinds of silicon
        named = f"reference taken on {taken_on or 'a CPU'} of {kinds[0]}, this run on {kinds[1]}"
    measured = not_comparable(reference_env, current_env, dtypes) if node_probes(current_env) else None
    if measured and named_only(reference_env, current_env, dtypes):
        measured = None
    if measured and named:
        return f"{measured}; {named}"
    return measured or (f"not comparable: {named}" if named else None)


def named_only(reference_env: Optional[dict[str, Any]], current_env: dict[str, Any],
               dtypes: Optional[Collection[str]]) -> bool:
    """A reference whose machine a saved nccl-tests output names (its Rank lines' GPUs, no probe: an
    acceptance log imported and submitted, harness/verdict/imported.py) judges a collective (no matmul
    rate: dtypes == []) run on a machine of that name; the verdict says so (compare.judge)."""
    machine = (reference_env or {}).get("machine")
    return (isinstance(machine, dict) and machine.get("source") == OUTPUT_MACHINE and not node_probes(reference_env)
            and dtypes is not None and not dtypes and machine_of(reference_env) == machine_of(current_env))


def device_of(env: Optional[dict[str, Any]]) -> Optional[str]:
    """What a measurement computed on, 'cuda' or 'cpu': its probe's device, else 'cuda' where the
    fingerprint names GPUs and 'cpu' where it names a CPU model only; None where it says neither (a
    published figure)."""
    probes = node_probes(env)
    if probes and probes[0].get("device"):
        return str(probes[0]["device"])
    name = machine_of(env)
    return None if name is None else "cuda" if (hardware(env["machine"])["gpu_model"]) else "cpu"


def machine_name(env: Optional[dict[str, Any]], platform: str) -> str:
    """A machine in a few words: 'H100 80GB HBM3', '8 x H100 80GB HBM3', 'AMD EPYC 7763 64-Core
    Processor (2 CPUs, AVX2)' (the probe's ISA class when it has one); the platform's name when the
    fingerprint does not say (a published figure)."""
    name = machine_of(env)
    if name is None:
        return platform
    name = re.sub(r"\((R|TM)\)", "", name).replace("NVIDIA ", "")
    if name.startswith("1 x "):
        name = name[len("1 x "):]
    return with_isa(name, env)


def with_isa(name: str, env: Optional[dict[str, Any]]) -> str:
    """A CPU machine's name with its probe's ISA class and its CPU's kind where the record keeps it: 'AMD EPYC
    (2 CPUs, AVX2)', 'AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2)' (the same CPU name, another
    machine each: KIND_SEP starts the kind, without_kind drops it); a GPU node's name as it is."""
    probes = node_probes(env)
    isa = (probes[0].get("isa") or {}).get("class") if probes and probes[0].get("device") == "cpu" else None
    if isa:
        name = name[:-1] + f", {isa})" if name.endswith(" CPUs)") else f"{name} ({isa})"
    kind = kind_of(env)
    if kind and name.endswith(")"):   # a CPU machine's name always does: machine_of's '(N CPUs)'
        name = name[:-1] + f"{KIND_SEP}{kind})"
    return name


KIND_SEP = "; "
"""Where a CPU machine's name (with_isa) gives its kind: 'AMD EPYC (2 CPUs, AVX2; family 23 model 49)'."""


def kind_of(env: Optional[dict[str, Any]]) -> Optional[str]:
    """The kind of a CPU machine's CPU (benchmarks/node/machine.py cpu_kind: 'family 26 model 2') from its
    fingerprint's machine (rank 0's node); None for a GPU node (its GPUs name it) or a record from before the
    CPU's id was kept, which then proves nothing either way."""
    machine = (env or {}).get("machine") if isinstance(env, dict) else None
    if not isinstance(machine, dict) or machine.get("gpus") or not isinstance(machine.get("cpu"), dict):
        return None
    return cpu_kind(machine["cpu"])


def without_kind(name: str) -> str:
    """A machine's name (with_isa) without its CPU's kind: what a name written before the kind was kept reads."""
    return re.sub(rf"{re.escape(KIND_SEP)}[^;()]*\)$", ")", name)


def names_agree(name: str, other: str) -> bool:
    """Whether two machine names (with_isa) may be one machine: the same, or the same but for a kind that one
    of them (written before the CPU's id was kept) lacks."""
    return name == other or (without_kind(name) == without_kind(other)
                             and (without_kind(name) == name or without_kind(other) == other))


def nearness(current_env: Optional[dict[str, Any]]):
    """A reference's nearness to the run's machine by their probes (-probe_distance; -inf where either lacks the
    figures), one figure per machine name (the first of its references read), so that the references of one machine
    tie and what follows nearness decides among them (compare._best)."""
    seen: dict[str, float] = {}

    def near(ref: Any) -> float:
        name = ref.machine()
        if name not in seen:
            d = probe_distance(ref.provenance and ref.provenance.environment, current_env)
            seen[name] = -math.inf if d is None else -d
        return seen[name]
    return near


def this_machine(platform: str, device: str, launcher: str = "local") -> Optional[str]:
    """The machine this process runs on, in machine_name's words, for a platform whose ranks run here: a cpu
    platform's launched locally (its CPU, usable CPUs and the probe's ISA class, read without timing anything:
    the probe's own isa()); None otherwise: a GPU platform's ranks run on its nodes (their table is the GPU's
    own), a Slurm-launched one's on nodes this process does not see."""
    if device != "cpu" or launcher != "local":
        return None
    probe = {"device": "cpu", "isa": isa(), "matmul": {}}   # no rate timed: only what names the machine
    return machine_name({"machine": {"cpu": cpu(), "gpus": None, "probe": probe}}, platform)


@dataclass(frozen=True)
class Apart:
    """Why a reference's machine cannot judge a run's speed, and the two machines."""
    reason: str
    """'not comparable: H100 80GB HBM3 vs H200: memory bandwidth (triad) 3,030 vs 4,292 GB/s'."""
    machines: tuple[str, str]
    """(this run's machine, the reference's), named by machine_name; told apart where the names agree."""
    device: Optional[str] = None
    """What the two computed on (device_of: this run's, else the reference's), None where neither says."""


def apart(reference_env: Optional[dict[str, Any]], current_env: dict[str, Any], reference_platform: str,
          platform: str, dtypes: Optional[Collection[str]] = None) -> Optional[Apart]:
    """The two machines when they differ, None when the reference can judge the run. On one platform
    as machines_apart decides (`dtypes`: the matmul rates compared); across two platforms always
    (another platform is another machine and set-up), in words: the two machines, then what their
    probes measured apart."""
    now, then = machine_name(current_env, platform), machine_name(reference_env, reference_platform)
    if reference_platform != platform and now == then:
        now, then = f"{now} ({platform})", f"{then} ({reference_platform})"
    elif now == then:
        now, then = f"{now} (now)", f"{then} (reference)"
    device = device_of(current_env) or device_of(reference_env)
    if reference_platform == platform:
        why = machines_apart(reference_env, current_env, dtypes)
        return Apart(why, (now, then), device) if why else None
    measured = not_comparable(reference_env, current_env, dtypes) if node_probes(current_env) else None
    words = [w for w in (measured or "").removeprefix("not comparable: ").split("; ")
             if w and not w.startswith("GPU ")]   # the GPUs are named already
    if not words and machine_of(reference_env) == machine_of(current_env) and machine_of(current_env):
        words = [f"platform {platform} vs {reference_platform}"]
    return Apart(f"not comparable: {now} vs {then}" + (f": {'; '.join(words)}" if words else ""), (now, then), device)


def geomean(ratios: list[float]) -> Optional[float]:
    """The geometric mean of positive ratios: the one ratio whose power n is their product, so a pair
    of configurations at 0.5x and 2x reads 1x (an arithmetic mean would say 1.25x)."""
    good = [r for r in ratios if isinstance(r, (int, float)) and r > 0 and math.isfinite(r)]
    return math.exp(sum(math.log(r) for r in good) / len(good)) if good else None


def better_ratio(v: Any) -> Optional[float]:
    """now/reference of a verdict's better-is-higher quantity (a time or memory inverted); None
    without both medians."""
    now, ref = v.value, v.reference
    if not all(isinstance(x, (int, float)) and x > 0 and math.isfinite(x) for x in (now, ref)):
        return None
    direction = METRICS[v.metric].direction if v.metric in METRICS else "higher"
    return now / ref if direction == "higher" else ref / now


@dataclass
class MachinePair:
    """What the verdicts between two machines say, summed up."""
    now: str
    reference: str
    speed_metric: Optional[str] = None
    """The throughput the pair is summed up by (SPEED_METRICS); None when no row has one."""
    speed: list[Any] = field(default_factory=list)
    """The speed_metric's verdicts (one per paired configuration) in this machine's order, fastest first."""
    speed_ratio: Optional[float] = None
    """Geometric mean over the configurations of now/reference of speed_metric."""
    efficiency: dict[str, tuple[float, int]] = field(default_factory=dict)
    """{metric: (geometric mean of now/reference, configurations)} of the efficiencies judged across."""
    swapped: list[tuple[Any, Any]] = field(default_factory=list)
    """Pairs of speed verdicts (ahead now, ahead on the reference's machine) whose order the two machines
    disagree on by more than a run's noise on either machine (noise_pct); [] when the configurations rank
    alike."""
    ties: list[tuple[Any, Any]] = field(default_factory=list)
    """Pairs whose order the two machines disagree on within noise_pct on both: a tie on both machines,
    not a change of ranking."""
    balance: dict[str, tuple[str, float, int]] = field(default_factory=dict)
    """{efficiency metric: (dtype, the efficiency a step all memory traffic reads on this machine over the
    reference's (pace.Balance.memory_bound, geometric mean over the rows), rows that balance explains)}."""
    noise_pct: float = 0.0
    """How far one run's throughput strays from another's of the same configuration on one machine
    (RANK_NOISE_PCT of the machines' device)."""

    @property
    def num_configs(self) -> int:
        return len(self.speed)

    def ratios(self) -> list[float]:
        return [r for r in (better_ratio(v) for v in self.speed) if r is not None]

    @staticmethod
    def gaps_pct(a: Any, b: Any) -> tuple[float, float]:
        """(how far a swapped pair's first is ahead on this machine, its second on the reference's), percent."""
        return 100.0 * (a.value / b.value - 1), 100.0 * (b.reference / a.reference - 1)


RANK_NOISE_PCT = PACE_NOISE_PCT
"""How far one run's throughput may stray from another's of the same configuration on one machine, by
device: two configurations whose order two machines disagree on by no more than this on both are tied
on both, not ranked otherwise. The machine's own pace noise (harness/probe.py PACE_NOISE_PCT), which the
records bear out: on one H100 80GB HBM3 node ZeRO-1's llama-440m read 716.3 and 711.1 samples/s in two
benches (0.7 %), and ZeRO 0, 1 and 2, which on one GPU communicate nothing, 706-716 (1.4 %; an H200's
787-797, 1.3 %), within cuda's 3 %; the cpu references' three repeats of one configuration
(reference_results/cpu.json, the 2-core AVX2 EPYC) lie 1.3-25.8 % apart (median 9.6 %), cpu's 15 %."""


def rank_noise_pct(device: Optional[str]) -> float:
    """RANK_NOISE_PCT of a device; the narrowest where the records do not say (a published figure), so
    that no order is called a tie on a guess."""
    return RANK_NOISE_PCT.get(device or "", min(RANK_NOISE_PCT.values()))


def machine_pairs(verdicts: list, efficiencies: tuple[str, ...]) -> list[MachinePair]:
    """One MachinePair per pair of machines the verdicts were made across (Verdict.machines), in the
    order they first appear."""
    pairs: dict[tuple[str, str], list] = {}
    for v in verdicts:
        if v.machines and v.value is not None and v.reference is not None:
            pairs.setdefault(tuple(v.machines), []).append(v)
    out = []
    for (now, then), rows in pairs.items():
        pair = MachinePair(now, then)
        metric = next((m for m in SPEED_METRICS if any(v.metric == m and better_ratio(v) for v in rows)), None)
        if metric:
            seen: dict[str, Any] = {}
            for v in rows:
                if v.metric == metric and better_ratio(v) is not None:
                    seen.setdefault(_config_id(v), v)
            pair.speed_metric = metric
            pair.speed = sorted(seen.values(), key=lambda v: -v.value)
            pair.speed_ratio = geomean(pair.ratios())
            pair.noise_pct = rank_noise_pct(next((v.device for v in rows if v.device), None))
            disagree = [(a, b) for i, a in enumerate(pair.speed) for b in pair.speed[i + 1:]
                        if a.value > b.value and a.reference < b.reference]
            pair.ties = [(a, b) for a, b in disagree if max(pair.gaps_pct(a, b)) <= pair.noise_pct]
            pair.swapped = [s for s in disagree if s not in pair.ties]
        for m in efficiencies:   # judged across, or within what the machines' balance allows (v.balance)
            judged = [v for v in rows if v.metric == m and (v.verdict != "not comparable" or v.balance)]
            ratios = [r for r in (better_ratio(v) for v in judged) if r is not None]
            if ratios:
                pair.efficiency[m] = (geomean(ratios), len(ratios))
            weighed = [v for v in judged if v.balance]
            if weighed and m not in pair.balance:
                b = weighed[0].balance
                pair.balance[m] = (b["dtype"], geomean([v.balance["reference"] / v.balance["now"] for v in weighed]),
                                   sum(v.verdict == "not comparable" for v in weighed))
        out.append(pair)
    return out


def _config_id(v: Any) -> str:
    return json.dumps([v.platform, v.benchmark, v.config], sort_keys=True, default=str)
