"""The machine's pace while a run measured, against its reference's: what the verdicts ask before they call a
change the software's (harness/verdict/explained.py). The pulses (benchmarks/node/probe.py pulse and
pulse_triad, read by one rank on each machine right before and right after a run measures) give the
machine's matmul and memory pace (pace); the same over each side's own probe is the pace an efficiency
against the probe's rate moves with (probe_pace); the CPU time the ranks got beside other work (cpu_share);
and two machines' balance of matmul rate and memory bandwidth, which moves an efficiency between machines
(balance)."""
from __future__ import annotations

import statistics
from typing import Any, Collection, NamedTuple, Optional

from contract.metrics import METRICS

from .probe import DTYPE_ORDER, PACE_NOISE_PCT, UNIT_WORDS, best_figure, node_probes

MEMORY_PACE_NOISE_PCT = {"cpu": 25.0, "cuda": 5.0}
"""How far a run's memory pace (the triad's pulse, harness/nodes.py pulse_of) may differ from the reference's
before the machine's memory counts as having run at another speed (harness/verdict/explained.py
at_machine_pace). cpu, measured on the 2-core AVX-512 EPYC on a quiet box: a pulse's triad read 29.6-41.2
GB/s per core, the better of two 33.5-41.8 (0.80x of the best), against the probe's 38.9; beside one
neighbour streaming memory on the other core 20.0-22.4 (0.55x), while the fp32 pulse read 0.88x. cuda: not
measured yet; the probe's triad tolerance (harness/probe.py TOLERANCE_PCT, 3.5x the widest seen over two nodes' benches)."""


EXCHANGE_MOVED = 1.15
"""The host's exchange latency (load.pulse_exchange_us, benchmarks/node/exchange.py) moved when one side's is this
much the other's or more: on the 2-core Zen 5 VM its lower quartile (the slower of a round's two) read 1.15x its
median or more in 13 of 100 rounds, the host's slow spells, where gloo's small all_reduce and reduce_scatter read
1.51x and 1.61x their calm rounds' (tests/perf/exchange_spells.py). A comparison names it (harness/verdict/changes.py); where a run was slower
by it, a small size's change within SPELL_SLOPE's reach is not comparable (harness/verdict/explained.py
at_exchange_spell)."""
SPELL_SLOPE = 2.6
"""How much more the small sizes slow than the exchange pulse in a spell: in the 13 spell rounds of
tests/data/exchange_spells/, each op's lower quartile over its calm median, less one, over the pulse's (the slower
of the round's two) over its median, less one, read 0.16-2.62 (all_reduce 0.52-2.62, reduce_scatter 0.16-2.62). A
sweep beside a pulse r times the reference's may then read down to 1 / (1 + SPELL_SLOPE (r - 1)) of its speed."""


def exchange_pulses(reference_env: Optional[dict[str, Any]],
                    current_envs: list[Optional[dict[str, Any]]]) -> Optional[tuple[float, float]]:
    """(now, then): the host's exchange latency (load.pulse_exchange_us, us) over the group's records (their median)
    and the reference's; None where either side lacks it (a reference taken before it was read, a GPU)."""
    def of(env: Optional[dict[str, Any]]) -> Optional[float]:
        x = ((env or {}).get("load") or {}).get("pulse_exchange_us")
        return float(x) if isinstance(x, (int, float)) and x > 0 else None

    now = [x for x in (of(e) for e in current_envs) if x is not None]
    then = of(reference_env)
    return (statistics.median(now), then) if now and then else None


class Pace(NamedTuple):
    now: float
    then: float
    unit: str
    device: str
    memory: Optional[tuple[float, float]] = None
    """(now, then): the memory pace, the triad's GB/s, where this run read one (load.pulse_triad)."""
    devices: str = ""
    """How the matmul pace counts every device (matmul_pace): '' where neither side read its devices at once."""


def pace(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]]) -> Optional[Pace]:
    """(now, then, unit, device, memory): the machine's fp32 matmul pace while this run measured (its
    load.pulse_fp32, benchmarks/node/probe.py pulse) and the reference's (its own pulse, else its probe's fp32
    best, the same measurement at more repeats); memory, the same of the triad (load.pulse_triad, else the
    reference's probe triad), None where this run read none; None where either side lacks a matmul pace or
    the two ran on other devices. The matmul pace counts every device where the records read them all at once
    (matmul_pace)."""
    now = ((current_env or {}).get("load") or {}).get("pulse_fp32")
    ref_probes, cur_probes = node_probes(reference_env), node_probes(current_env)
    if not isinstance(now, (int, float)) or now <= 0 or not ref_probes or not cur_probes:
        return None
    device = cur_probes[0].get("device") or "cpu"
    if ref_probes[0].get("device") != device:
        return None
    then = ((reference_env or {}).get("load") or {}).get("pulse_fp32")
    if not isinstance(then, (int, float)) or then <= 0:
        then = best_figure(ref_probes[0], "matmul", "fp32")
    if not then:
        return None
    now, then, devices = matmul_pace(float(now), float(then), _devices(current_env), _devices(reference_env))
    memory_now = ((current_env or {}).get("load") or {}).get("pulse_triad")
    memory_then = ((reference_env or {}).get("load") or {}).get("pulse_triad")
    if not isinstance(memory_then, (int, float)) or memory_then <= 0:
        memory_then = best_figure(ref_probes[0], "triad")
    memory = ((float(memory_now), float(memory_then))
              if isinstance(memory_now, (int, float)) and memory_now > 0 and memory_then else None)
    return Pace(now, then, UNIT_WORDS.get(device, "GFLOP/s"), device, memory, devices)


def matmul_pace(now: float, then: float, devices_now: Optional[dict[str, Any]],
                devices_then: Optional[dict[str, Any]]) -> tuple[float, float, str]:
    """(now, then, words): the matmul pace of a step that waits for every device. Where both sides read every
    rank's own device at once (load.pulse_devices, harness/nodes.py), their slowest devices', like for like (the
    pace with every device busy, as the steps run: a GPU of eight that runs slower, a VM's host that runs its
    vCPUs slower while all are busy); else each side's machine's pulse alone (load.pulse_fp32, one device while
    the others wait) counting its devices where it read them (pulse_devices.paced: the slowest machine's pulse times
    its slowest device over its fastest, read at once: one device slower than the rest of its machine, whatever a
    machine does with all of them busy), as is where it did not (a reference from before)."""
    if devices_now and devices_then:
        return devices_now["slowest"], devices_then["slowest"], (
            f"every device at once, the slowest's (rank {devices_now['rank']} now)")
    paced_now, paced_then = (min(x, d.get("paced") or x) if d else x
                             for x, d in ((now, devices_now), (then, devices_then)))
    spread_now, spread_then = paced_now / now, paced_then / then
    slow = devices_now if spread_now <= spread_then else devices_then
    words = "" if min(spread_now, spread_then) >= 1.0 or slow is None else (
        f"{'this run' if slow is devices_now else 'the reference'}'s slowest device (rank {slow['rank']}) at "
        f"{slow['slowest'] / slow['fastest']:.2f}x its machine's fastest, read at once")
    return paced_now, paced_then, words


def slow_device(env: Optional[dict[str, Any]]) -> Optional[tuple[Optional[int], str, float]]:
    """(rank, host, its pace over the fastest's) of a fingerprint's slowest device read at once (load.pulse_devices)
    where it lies below the fastest's by more than the pulse's noise (harness/probe.py PACE_NOISE_PCT): one device
    slower than the rest; None otherwise, and where the record did not read them."""
    d = _devices(env)
    if d is None:
        return None
    probes = node_probes(env)
    kind = (probes[0].get("device") if probes else None) or "cpu"
    spread = d["slowest"] / d["fastest"]
    noise = PACE_NOISE_PCT.get(kind, PACE_NOISE_PCT["cpu"])
    return (d.get("rank"), str(d.get("host")), spread) if (1 - spread) * 100 > noise else None


def _devices(env: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """A fingerprint's load.pulse_devices where it holds a slowest and a fastest pace; None otherwise."""
    d = ((env or {}).get("load") or {}).get("pulse_devices")
    ok = isinstance(d, dict) and all(isinstance(d.get(k), (int, float)) and d[k] > 0 for k in ("slowest", "fastest"))
    return d if ok else None


OF_PROBE = "of its bench's probe"
"""The unit of a probe_pace: a pace over its own bench's probe figure."""


def probe_pace(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]]) -> Optional[Pace]:
    """The pace an efficiency against the probe's matmul rates (matmul_eff_pct) moves with on one machine: each
    side's pace (pace()) over its own bench's probe figure, the fp32 matmul's and the triad's, in unit OF_PROBE.
    The probe is read once, before a bench's first run; a machine that slowed after it reads lower samples/s,
    which its pace explains, and a lower efficiency against the probe's rate, which only this explains. A
    reference without a pulse of its own is at 1x its probe. None where pace() is, or a probe lacks fp32."""
    p = pace(reference_env, current_env)
    if p is None:
        return None
    cur, ref = node_probes(current_env)[0], node_probes(reference_env)[0]
    mm_now, mm_then = best_figure(cur, "matmul", "fp32"), best_figure(ref, "matmul", "fp32")
    if not mm_now or not mm_then:
        return None
    tr_now, tr_then = best_figure(cur, "triad"), best_figure(ref, "triad")
    memory = (p.memory[0] / tr_now, p.memory[1] / tr_then) if p.memory and tr_now and tr_then else None
    return Pace(p.now / mm_now, p.then / mm_then, OF_PROBE, p.device, memory, p.devices)


def material_cpus(cpus: int) -> float:
    """How far other work (or steal) must differ, in CPUs, to count as a change of the machine's load: half a
    CPU, or a quarter of its CPUs if more (one busy neighbour on a 2-core box)."""
    return max(0.5, 0.25 * cpus)


SHARE_NOISE_PCT = 8.0
"""How far the CPU time a run's ranks got (load.run_cpus) may differ from the reference's before it counts as
another share of the machine (harness/verdict/explained.py at_cpu_share): the CPU time is counted by the kernel, not
timed, and reads steadier than the pulse (PACE_NOISE_PCT, 15 %). Measured, the widest spread of quiet runs of one
configuration: the cpu nightly's 8 quiet nights on the 2-core Zen 5 box (2026-12-06, 24 runs each of llama-tiny
ZeRO-1 and ZeRO-2) 1.043x and 1.079x, while their samples/s spread 1.107x and 1.215x; the cpu-cluster nightly's 13
quiet nights (tests/data/cluster_nights, 39 runs each) 1.043x and 1.061x. Against the pulse's 15 %, a neighbour that
took a sixth of the ranks' CPU time went unexplained: the emulated cluster with two ranks a node (four ranks on two
cores, tests/data/neighbour/two_a_node) beside one busy loop got 0.85x the CPU time and ran at 0.85x its samples/s,
which read as a regression."""


class Share(NamedTuple):
    """The CPU time a run's ranks got while they measured, against its reference's (environment.load); other_*
    is the CPUs' worth taken from them, other work and the hypervisor's steal together, of which steal_*."""
    now: float
    then: float
    other_now: float
    other_then: float
    cpus: int
    steal_now: float = 0.0
    steal_then: float = 0.0
    waited: Optional[tuple[float, float]] = None
    """(now, then): the CPUs' worth the ranks waited for a CPU (load.wait_cpus) where both sides read it
    (cpu_share): what showed the other work taking their time on an unsaturated machine, and what bounds it
    (ratio)."""
    median_step: bool = False
    """now's figures are its median step's (load.at_median), not its whole window's"""

    @property
    def ratio(self) -> float:
        """The ranks' CPU time now over then, as far as other work explains it: where their waits were read, the
        busier side's ranks could have had no more than the CPU time they got plus what they waited for a CPU beyond
        the other side's. A rank asleep, or waiting on a peer or the network, waits on no run queue: a run slowed by
        a sleep of its own beside a neighbour got less CPU time without being denied it (the attribution corpus's
        slowed micro-step, 0.3 s a micro-step, beside a unit-test run: 0.42 vs 1.31 CPUs, which alone read as the
        neighbour's and explained the slowdown)."""
        if self.waited is None:
            return self.now / self.then
        if self.other_now > self.other_then:
            return self.now / min(self.then, self.now + max(self.waited[0] - self.waited[1], 0.0))
        return min(self.now, self.then + max(self.waited[1] - self.waited[0], 0.0)) / self.then


WAITED_CPUS = 0.2
"""How much more the busier side's ranks must have waited for a CPU (load.wait_cpus, CPUs' worth over the
window) for other work to count as having taken their CPU time on a machine it left unsaturated on average.
The emulated 2-node cluster's training runs (nodes sharing the 2-core AVX-512 EPYC, 2026-12-05,
tests/data/cluster_nights/neighbour.jsonl.gz): their ranks alternate computing and waiting on the link, so the
box read 1.62-1.78 busy CPUs beside a neighbour of one CPU, mostly under cpu_share's saturation, while their
ranks waited 0.52-0.74 CPUs' worth for a CPU against 0.09-0.13 on quiet nights, and 0.08-0.12 with the link
slowed to 750 Mbit/s (a rank waiting on a socket waits on no run queue). The two ranks of one host wait on
each other's threads too, hence the quiet figure."""


def _waits(reference_env: Optional[dict[str, Any]],
           current_envs: list[Optional[dict[str, Any]]]) -> Optional[tuple[float, float]]:
    """(now, then): the CPUs' worth the ranks waited for a CPU (load.wait_cpus; now the median over the group's
    records), None where either side's records lack it (a record from before, a kernel without schedstat)."""
    now = [w for e in current_envs if isinstance(w := _load(e).get("wait_cpus"), (int, float))]
    then = _load(reference_env).get("wait_cpus")
    return (statistics.median(now), float(then)) if now and isinstance(then, (int, float)) else None


def cpu_share(reference_env: Optional[dict[str, Any]], current_envs: list[Optional[dict[str, Any]]]) -> Optional[Share]:
    """The CPUs' worth this run's ranks got while they measured (load.run_cpus, the median over the group's
    records) against the reference's, where other work on the machine (load.other_cpus) differed by a
    material share of it (material_cpus, as "what changed" names load.other_cpus) and
    the busier side's machine was saturated (its busy CPUs within a quarter CPU of all it has), so that
    the other work took CPU time from the ranks, or its ranks waited for a CPU WAITED_CPUS more than the
    other side's (load.wait_cpus: their threads ready to run while another task held the CPU); on cpu only,
    where the ranks' speed is the CPU time they get. None otherwise: a run that got less CPU on an
    unsaturated machine without waiting for one waited of its own accord (on the network, on a peer).
    A virtual machine's hypervisor steal (load.steal_cpus: its host running other guests) counts with the
    other work: no process here did it, busy_cpus leaves it out, and it takes the ranks' CPU time all the
    same (this 2-core VM's host took 0.3-1.0 CPUs through whole CI runs on 2026-12-03)."""
    share = taken(reference_env, current_envs)
    if share is None:
        return None
    busy_now = statistics.median(f[2] for e in current_envs if (f := _load_figures(e)) and _on_cpu(e))
    busy_then = _load_figures(reference_env)[2]   # type: ignore[index]   (taken() read it)
    busy, cpus = ((busy_now + share.steal_now, share.cpus) if share.other_now > share.other_then
                  else (busy_then + share.steal_then, _cpus(reference_env)))
    waits = _waits(reference_env, current_envs)
    waited = waits is not None and (waits[0] - waits[1] if share.other_now > share.other_then
                                    else waits[1] - waits[0]) >= WAITED_CPUS   # the busier side's ranks
    saturated = busy >= cpus - 0.25
    if not cpus or abs(share.other_now - share.other_then) < material_cpus(cpus) or not (saturated or waited):
        return None
    if share.now <= 0 or share.then <= 0 or not share.cpus:
        return None
    return share._replace(waited=waits)


def taken(reference_env: Optional[dict[str, Any]], current_envs: list[Optional[dict[str, Any]]]) -> Optional[Share]:
    """The load on both sides, whatever it did to the ranks: the CPU time they got (load.run_cpus) and the CPUs'
    worth other work and the hypervisor's steal took (median over the group's records, on cpu), against the
    reference's; None where a side is not on cpu or its record lacks the load."""
    cur = [e for e in current_envs if _on_cpu(e) and _load_figures(e)]
    then = _load_figures(reference_env) if _on_cpu(reference_env) else None
    if not cur or then is None:
        return None
    figures = [_load_figures(e) for e in cur]
    run_now, other_now, _, steal_now = (statistics.median(f[i] for f in figures) for i in range(4))   # type: ignore[index]
    return Share(run_now, then[0], other_now + steal_now, then[1] + then[3], _cpus(cur[0]), steal_now, then[3],
                 median_step=all(_steps(e) is not None for e in cur))


def one_cpu_host(config: dict[str, Any], reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]],
                 metric: Optional[str] = None) -> bool:
    """Whether a configuration ran on one cpu host on both sides (config nodes 1, both probes on cpu), where a
    collective's bus bandwidth is the host's memory and CPUs (contract.metrics host_paced): the pace explains it
    as it explains a training run, and other work or the hypervisor's steal beside it moves it far beyond the
    CPU time they take (explained.at_busy_host: its exchanges wait on the ranks' wake-ups). Measured on the
    2-core AVX-512 EPYC, gloo's short sweep (1K-4M) beside a process taking one core: the ranks got 0.71-0.77x
    their quiet CPU time and all_gather, broadcast and reduce_scatter read 0.4-0.7x their quiet average bus
    bandwidth, all_reduce 0.9-1.0x (tests/data/neighbour_collectives); with 0.79 CPUs stolen, 0.14-0.40x
    (tests/perf/busy_host.py). Across nodes the bytes cross the network, which no pulse reads: not paced.
    Except a `metric` of the small sizes (contract.metrics latency_bound) where every node ran on one kernel on both sides
    (load.kernels 1: the emulated cluster's nodes, network namespaces of one machine): beside a neighbour of
    one CPU all_gather's small sizes' time read 1.40-1.62x its quiet nights' (a night's median of 3) while
    the largest sizes' busbw, the link's, held at 0.99-1.00x (tests/data/cluster_nights/neighbour.jsonl.gz)."""
    if not (_on_cpu(reference_env) and _on_cpu(current_env)):
        return False
    return config.get("nodes") == 1 or (metric in METRICS and METRICS[metric].latency_bound and all(
        ((e or {}).get("load") or {}).get("kernels") == 1 for e in (reference_env, current_env)))


def _cpus(env: Optional[dict[str, Any]]) -> int:
    """The CPUs a fingerprint's machine lets the run use (usable, else logical); 0 where it does not say."""
    cpu = ((env or {}).get("machine") or {}).get("cpu") or {}
    return int(cpu.get("usable_cpus") or cpu.get("logical_cpus") or 0)


def _on_cpu(env: Optional[dict[str, Any]]) -> bool:
    probes = node_probes(env)
    return bool(probes) and (probes[0].get("device") or "cpu") == "cpu"


def _load(env: Optional[dict[str, Any]]) -> dict[str, Any]:
    """A fingerprint's load as the CPU share reads it: over the timed step at the run's median (load.at_median,
    harness/nodes.py), the step its samples/s comes from, where the record kept it; else over its whole window
    (warm-up and profiled steps too; a collective sweep, a record from before). Each side is read its own way: a
    quiet reference's window and its median step read alike (tests/perf/windowed_share.py)."""
    load = (env or {}).get("load") or {}
    steps = _steps(env)
    return {**load, **{k: v for k, v in steps.items() if k not in ("steps", "of", "wall_s")}} if steps else load


def _steps(env: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """A fingerprint's load.at_median where it holds the figures the share reads; None otherwise."""
    steps = (((env or {}).get("load") or {}).get("at_median"))
    return steps if isinstance(steps, dict) and all(isinstance(steps.get(k), (int, float)) for k in
                                                    ("run_cpus", "other_cpus", "busy_cpus")) else None


def _load_figures(env: Optional[dict[str, Any]]) -> Optional[tuple[float, float, float, float]]:
    """(run_cpus, other_cpus, busy_cpus, steal_cpus) of a fingerprint's load (_load), steal 0 where unread (bare
    metal, an older record); None where it lacks one of the others."""
    load = _load(env)
    figures = tuple(load.get(k) for k in ("run_cpus", "other_cpus", "busy_cpus"))
    if not all(isinstance(x, (int, float)) for x in figures):
        return None
    steal = load.get("steal_cpus")
    return (*figures, float(steal) if isinstance(steal, (int, float)) and steal > 0 else 0.0)   # type: ignore[return-value]


class Balance(NamedTuple):
    """Two machines' balance: FLOP of the run's matmuls per byte of memory traffic each can do (its probe's
    matmul rate of `dtype` over its triad; per core on cpu, whose probe times one core of each)."""
    now: float
    then: float
    dtype: str
    device: str

    @property
    def memory_bound(self) -> float:
        """The efficiency (against the matmul rate) a step all memory traffic reads here, over the
        reference's: then/now. A step all matmuls reads 1x; any step lies between the two."""
        return self.then / self.now


def balance(reference_env: Optional[dict[str, Any]], current_env: Optional[dict[str, Any]],
            dtypes: Collection[str]) -> Optional[Balance]:
    """The two machines' Balance in the first of `dtypes` (the suite's dtype order) both probes measured
    with their triads (rank 0's nodes); None where a side lacks them or the two computed on other devices.
    An efficiency against the matmul rate alone (matmul_eff_pct) moves with it between machines: a step
    whose time is memory traffic (the elementwise kernels of an eager step; the optimizer's pass over
    its states) reads lower on the machine with more FLOP per byte, at the same software."""
    ref, cur = node_probes(reference_env), node_probes(current_env)
    if not ref or not cur or (ref[0].get("device") or "cpu") != (cur[0].get("device") or "cpu"):
        return None
    for d in (d for d in DTYPE_ORDER if d in dtypes):
        figures = [(best_figure(p, "matmul", d), best_figure(p, "triad")) for p in (cur[0], ref[0])]
        if all(mm and triad for mm, triad in figures):
            (mm_now, tr_now), (mm_then, tr_then) = figures
            return Balance(mm_now / tr_now, mm_then / tr_then, d, cur[0].get("device") or "cpu")
    return None
