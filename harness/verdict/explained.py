"""Changes the machine explains: a regression (an improvement) of a metric that moves with the machine's speed or
the CPU time its ranks got, read "not comparable" where the measured pace (the pulse) or the CPU share puts the
change within the tolerance; and an efficiency judged across two machines whose change their balance (matmul
FLOP per byte of memory bandwidth) allows (compare.judge asks these before it says regression)."""
from __future__ import annotations

import statistics
from typing import Any, NamedTuple, Optional

from contract.collectives import STALL_FACTOR
from contract.metrics import METRICS

from ..pace import EXCHANGE_MOVED, MEMORY_PACE_NOISE_PCT, OF_PROBE, SHARE_NOISE_PCT, SPELL_SLOPE, Balance, Pace, Share
from ..probe import PACE_NOISE_PCT
from .by_size import SMALL_MEDIAN, SMALL_P25
from .references import Reference

PER_STEP = frozenset(name for name, m in METRICS.items() if m.per_step)


def worse_pct(current: float, reference: float, direction: str, metric: Optional[str] = None) -> float:
    """How much worse `current` is than `reference`, in percent (negative: better). A step's time (contract.metrics
    per_step) is judged as its rate: 1 - reference/current, what its samples/s of the same median reads."""
    if metric in PER_STEP and direction == "lower" and current > 0:
        return 100.0 * (current - reference) / current
    change = 100.0 * (current - reference) / reference
    return -change if direction == "higher" else change


def at_machine_pace(verdict: str, figures: dict[str, Any], ref: Reference, paces: Optional[Pace]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one, insufficient data
    whose point estimate lies beyond the tolerance) of a metric that moves with the machine's speed is
    the machine's own: this run's pulse read the machine slower (faster) than the reference's pace by more
    than the pulse's noise (PACE_NOISE_PCT), and at the machine's measured pace the change lies within the
    tolerance. Where the run read its memory pace too (the triad's pulse, Pace.memory), the two paces bound
    it: a step at the same software runs between them (all matmuls, all memory traffic), a pace within its
    noise (MEMORY_PACE_NOISE_PCT for the triad) counting as 1x, and the change is taken from the nearest
    point of that range. None otherwise: a change beyond what the machine's pace explains stays a
    regression, and a run with no pulse is judged as before."""
    kinded = _kind(verdict, figures, ref)
    if paces is None or kinded is None:
        return None
    kind, what = kinded
    ends = {"matmul": _moved(paces.now / paces.then, PACE_NOISE_PCT.get(paces.device, PACE_NOISE_PCT["cpu"]))}
    if paces.memory:
        now, then = paces.memory
        ends["memory"] = _moved(now / then, MEMORY_PACE_NOISE_PCT.get(paces.device, MEMORY_PACE_NOISE_PCT["cpu"]))
    lo, hi = min(ends.values()), max(ends.values())
    if (lo >= 1.0) if kind == "regression" else (hi <= 1.0):
        return None
    change = _beyond_range(figures, ref, lo, hi)
    if abs(change) > ref.tolerance_pct:
        return None
    extreme = lo if kind == "regression" else hi
    who = "the machine's memory" if ends.get("memory") == extreme != ends["matmul"] else "the machine"
    matmul = f"fp32 matmul ({paces.devices})" if paces.devices else "fp32 matmul"
    if paces.unit == OF_PROBE:   # an efficiency against the probe's rate: each side's pace over its own probe
        pulses = f"{matmul} {paces.now:.2f}x vs {paces.then:.2f}x {OF_PROBE}"
        pulses += (f", memory bandwidth (triad) {paces.memory[0]:.2f}x vs {paces.memory[1]:.2f}x" if paces.memory else "")
        pulses += ", which the efficiency is measured against: this run's pulses"
    else:
        pulses = f"{matmul} {paces.now:.3g} vs {paces.then:.3g} {paces.unit}"
        if paces.memory:
            pulses += f", memory bandwidth (triad) {paces.memory[0]:.3g} vs {paces.memory[1]:.3g} GB/s: this run's pulses"
        else:
            pulses += ", this run's pulse"
    return (f"not comparable: {who} ran {abs(1 - extreme) * 100:.0f} % {'slower' if extreme < 1 else 'faster'} during "
            f"this run than the reference's ({pulses}); at its own pace the {what} is a change of "
            f"{(round(-change, 1) or 0.0):+.1f} %, within the tolerance {ref.tolerance_pct:g} %")


def _moved(ratio: float, noise_pct: float) -> float:
    """A pace's ratio, now over the reference's; 1.0 where it lies within its noise."""
    return ratio if abs(ratio - 1.0) * 100 > noise_pct else 1.0


def _beyond_range(figures: dict[str, Any], ref: Reference, lo: float, hi: float) -> float:
    """How much worse (worse_pct, in the metric's own terms) the value is than the reference's at the point of
    [lo, hi] (ratios of the better-is-higher quantity, now over the reference's) nearest to it; 0 within."""
    now = figures["value"] / ref.value if ref.direction == "higher" else ref.value / figures["value"]
    nearest = min(max(now, lo), hi)
    return worse_pct(figures["value"], ref.value * nearest if ref.direction == "higher" else ref.value / nearest,
                     ref.direction, ref.metric)


def _within_speeds(figures: dict[str, Any], ref: Reference, speeds: tuple[float, float],
                   this_side: bool) -> Optional[tuple[float, float, float]]:
    """(lo, hi, speed) where the value's speed over the reference's lies within the tolerance of `speeds` (measured
    with the cause on this run's side; inverted where it was on the reference's); None beyond."""
    lo, hi = speeds if this_side else (1 / speeds[1], 1 / speeds[0])
    if abs(_beyond_range(figures, ref, lo, hi)) > ref.tolerance_pct:
        return None
    return lo, hi, figures["value"] / ref.value if ref.direction == "higher" else ref.value / figures["value"]


STEAL_NAMED_CPUS = 0.25
"""A hypervisor's steal worth naming beside the other work (a quarter CPU, either side)."""
BUSY_HOST_CPUS = 0.2
"""How much more (less) of the CPUs other work and steal must take beside a collective sweep on one cpu host than
beside its reference for at_busy_host: the least difference measured to move the sweep beyond its tolerance was
0.22 CPUs of steal (broadcast at 0.36x its bus bandwidth; tests/data/neighbour_collectives/graded/l0-r2)."""
BUSY_HOST_SWEEP = (0.12, 2.6)
"""The speeds (bus bandwidth now/quiet; the small sizes' time quiet/now) gloo's short sweep on one cpu host read
with other work or the hypervisor's steal taking BUSY_HOST_CPUS or more beside it (tests/perf/busy_host.py,
the 2-core AVX-512 EPYC, 2026-12-04; records in tests/data/neighbour_collectives/graded/): 0.129x (broadcast's
small sizes, 0.79 CPUs stolen) to 2.50x (reduce_scatter's small sizes beside a neighbour taking 0.83 CPUs, the
vCPUs no longer idle between exchanges), the ranks at 0.65-0.93x their quiet CPU time; rounded outwards."""


def at_busy_host(verdict: str, figures: dict[str, Any], ref: Reference, load: Optional[Share]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one) of a collective sweep on one
    cpu host (contract.metrics host_paced, pace.one_cpu_host) came with other work or the hypervisor's steal
    taking BUSY_HOST_CPUS more (less) than beside its reference (pace.taken), and the change lies within the
    tolerance of the speeds such a sweep read beside such load (BUSY_HOST_SWEEP; inverted where the reference
    was the busier side). A collective's exchanges wait on its ranks' wake-ups, which the load delays (a stolen
    vCPU stalls each one) or hastens (a busy vCPU skips the idle state), far from the CPU time the ranks lose:
    at_cpu_share's linear rule held for training, not here. None otherwise: a change beyond it stays a
    regression (improvement)."""
    kinded = _kind(verdict, figures, ref)
    if load is None or kinded is None or abs(load.other_now - load.other_then) < BUSY_HOST_CPUS:
        return None
    what = kinded[1]
    busier = load.other_now > load.other_then
    within = _within_speeds(figures, ref, BUSY_HOST_SWEEP, busier)
    if within is None:
        return None
    lo, hi, speed = within
    return (f"not comparable: {_takers(load)} took {load.other_now:.2f} of the machine's {load.cpus} CPUs while this "
            f"sweep measured (the reference's {load.other_then:.2f}); on one host a collective waits on its ranks' "
            f"wake-ups, which such load delays or hastens far beyond the CPU time it takes: beside it gloo's sweep "
            f"read {lo:.2f}-{hi:.2f}x the speed of its {'quiet' if busier else 'busy'} runs, and the {what} "
            f"({speed:.2f}x the reference's speed) lies within that")


def at_exchange_spell(verdict: str, figures: dict[str, Any], ref: Reference,
                      exchange: Optional[tuple[float, float]]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one) of a collective's small sizes on
    one cpu host (contract.metrics latency_bound) came with the host's exchange latency (harness/pace.py
    exchange_pulses) EXCHANGE_MOVED or more slower (faster) than beside its reference, a slow spell of the host on
    one side, and the change lies within the tolerance of the speeds gloo's small sizes read in such spells: down
    to 1 / (1 + SPELL_SLOPE (r - 1)) of the calm side's at a pulse r times as slow. None otherwise."""
    kinded = _kind(verdict, figures, ref)
    if exchange is None or kinded is None:
        return None
    now, then = exchange
    slower = now / then >= EXCHANGE_MOVED
    if not slower and then / now < EXCHANGE_MOVED:
        return None
    ratio = max(now / then, then / now)
    reach = (1 / (1 + SPELL_SLOPE * (ratio - 1)), 1.0)
    within = _within_speeds(figures, ref, reach, slower) if (kinded[0] == "regression") == slower else None
    if within is None:
        return None
    lo, hi, speed = within
    return (f"not comparable: the host's exchange latency (a ping-pong between two of its CPUs) read {now:.1f} us "
            f"during this sweep against the reference's {then:.1f} ({now / then:.2f}x): a slow spell of the host during "
            f"{'this sweep' if slower else 'the reference'}, in which gloo's small sizes read {lo:.2f}-{hi:.2f}x the "
            f"speed of its {'calm' if slower else 'slow'} runs, and the {kinded[1]} ({speed:.2f}x the reference's "
            f"speed) lies within that")


class HeldMedians(NamedTuple):
    """A collective's small calls, now and in its reference: the median call (small_median_us) and the lower
    quartile (small_p25_us) of each side (the group's medians of its records' figures; the reference's entries)."""
    now: float
    now_p25: float
    then: float
    then_p25: float


def held_medians(median_ref: Reference, references: list[Reference], records: list[Any]) -> Optional[HeldMedians]:
    """HeldMedians of a group's records (ResultRecord) against its small_median_us reference and the small_p25_us
    one taken with it (among `references`, the one of the same runs' fingerprint); None where either side lacks
    its quartile (a reference from before it was kept)."""
    env = median_ref.provenance and median_ref.provenance.environment
    p25 = next((r for r in references if r.metric == SMALL_P25 and r.status == "ok" and r.value and env
                and (r.provenance and r.provenance.environment) == env), None)
    pairs = [(r.metrics[SMALL_MEDIAN]["value"], r.metrics[SMALL_P25]["value"]) for r in records
             if SMALL_MEDIAN in r.metrics and SMALL_P25 in r.metrics]
    pairs = [(m, q) for m, q in pairs if q > 0]   # a quartile of 0 us is no call's time: nothing concluded
    if not pairs or p25 is None or p25.value <= 0 or not median_ref.value:
        return None
    return HeldMedians(statistics.median(m for m, _ in pairs), statistics.median(p for _, p in pairs),
                       median_ref.value, p25.value)


def at_held_up_median(verdict: str, figures: dict[str, Any], ref: Reference,
                      held: Optional[HeldMedians]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one) of the small calls' median
    (small_median_us) compares a median call the host held up with one it did not: this sweep's median is over
    STALL_FACTOR times its own lower quartile (the rule that counts a call held up, contract/collectives.py) and the
    reference's is not (or the other way round). Over half of one side's small calls were then held up for a
    scheduler's tick, and the median moved with how many were, not with the calls' speed; the lower quartile
    (small_p25_us) judges them. On the AVX2 EPYC (family 25) a bound sweep's all_reduce read its median 444-490 us
    in two sweeps and 2,753-3,022 in five back to back (41-60 % of its small calls held up), its lower quartile
    350-683. None otherwise: both held up, or neither, is a comparison of like with like."""
    kinded = _kind(verdict, figures, ref)
    if held is None or kinded is None:
        return None
    now_held, then_held = held.now > STALL_FACTOR * held.now_p25, held.then > STALL_FACTOR * held.then_p25
    if now_held == then_held or (kinded[0] == "regression") != now_held:
        return None
    side, calm = ("this sweep", "the reference") if now_held else ("the reference", "this sweep")
    median, p25 = (held.now, held.now_p25) if now_held else (held.then, held.then_p25)
    other, other_p25 = (held.then, held.then_p25) if now_held else (held.now, held.now_p25)
    return (f"not comparable: {side}'s median small call ({median:,.0f} us) is one the host held up, "
            f"{median / p25:.1f}x its lower quartile ({p25:,.0f} us; a call over {STALL_FACTOR:g}x it was held up), "
            f"{calm}'s ({other:,.0f} us) {other / other_p25:.1f}x its own: at most of {side}'s small sizes over half the "
            f"calls waited for the scheduler's tick, so the median moved with how many did, not with the calls' speed; "
            f"their lower quartile (small_p25_us) judges them")


def _takers(load: Share) -> str:
    """Who took the CPUs: the hypervisor's steal (named where a quarter CPU or more), other work, or both."""
    stolen = max(load.steal_now, load.steal_then) >= STEAL_NAMED_CPUS
    others = max(load.other_now - load.steal_now, load.other_then - load.steal_then) >= 0.05
    if stolen and not others:
        return "the hypervisor's steal (its host running other guests)"
    if stolen:
        return (f"other work and the hypervisor's steal ({load.steal_now:.2f} of it, the reference's {load.steal_then:.2f}: "
                "its host running other guests)")
    return "other work"


def at_cpu_share(verdict: str, figures: dict[str, Any], ref: Reference, share: Optional[Share]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement) of a metric that moves with the CPU time the
    ranks get is the other work's on a cpu machine: the ranks got less (more) CPU time than the reference's
    by more than its noise (SHARE_NOISE_PCT) while other work took a material share of the machine (harness/pace.py cpu_share),
    and at the CPU time they got the change lies within the tolerance. The pulse misses such a neighbour:
    it times one core while the node's other ranks wait, and one busy neighbour on a 2-core box leaves
    that core free. Measured on the 2-core AVX2 EPYC with a unit-test run beside a default-cpu bench:
    other work 0.63-0.78 CPUs, the ranks 1.19-1.32 CPUs against the references' 1.82-1.89, the runs at
    0.64-0.82x their samples/s, the pulses at 1.1x the references' probe. The same on the emulated 2-node
    cluster's training runs (tests/data/cluster_nights/neighbour), whose machine stayed under saturation
    while their ranks waited for a CPU (pace.WAITED_CPUS): beside a neighbour of one CPU the ranks got
    0.72-0.78x the CPU time of quiet nights and ran at 0.71-0.81x their samples/s (a night's median of 3)."""
    if share is None:
        return None
    ratio = share.ratio
    explained = _explained(verdict, figures, ref, ratio, SHARE_NOISE_PCT)
    if explained is None:
        return None
    what, change = explained
    during = "during this run's median step" if share.median_step else "while this run measured"
    return (f"not comparable: {_takers(share)} took {share.other_now:.2f} of the machine's {share.cpus} CPUs {during} "
            f"(the reference's {share.other_then:.2f}), and its ranks got {share.now / share.then:.2f}x the "
            f"reference's CPU time ({share.now:.2f} vs {share.then:.2f} CPUs"
            + (f"; they waited {share.waited[0]:.2f} CPUs' worth for a CPU, the reference's {share.waited[1]:.2f}"
               if share.waited else "")
            + (f"; as far as they waited, {ratio:.2f}x" if abs(ratio - share.now / share.then) > 0.005 else "")
            + f"); at that share the {what} is a change of {change}, within the tolerance {ref.tolerance_pct:g} %")


def at_balance(verdict: str, figures: dict[str, Any], ref: Reference, bal: Optional[Balance]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one) of an efficiency against the
    matmul rate, judged across two machines, lies within what the machines' balance allows (harness/pace.py balance): at the
    same software a step reads between 1x (all matmuls) and bal.memory_bound (all memory traffic) of the
    reference's efficiency, so a change within the tolerance of that range cannot be told from the machines.
    Measured: the H100 80GB HBM3 against the H200 (bf16 matmul within 2 %, triad 3.0 vs 4.3 TB/s): llama-440m's
    eager step, whose GPU time is 56 % elementwise kernels (tests/gpu/compute_breakdown.py), reads 0.87-0.88x
    the H200's efficiency, within [0.69x, 1x]. None otherwise, and where the balances lie within the pace's
    noise of each other (PACE_NOISE_PCT): a change beyond the range stays a regression (improvement)."""
    kinded = _kind(verdict, figures, ref)
    if bal is None or kinded is None:
        return None
    kind, what = kinded
    low = bal.memory_bound
    if abs(low - 1) * 100 <= PACE_NOISE_PCT.get(bal.device, PACE_NOISE_PCT["cpu"]):
        return None
    if (kind == "regression") != (low < 1):   # the range lies on the other side of 1x
        return None
    beyond = _beyond_range(figures, ref, min(low, 1.0), max(low, 1.0))
    if abs(beyond) > ref.tolerance_pct:
        return None
    where = ("within that range" if abs(beyond) < 0.05 else
             f"{abs(beyond):.1f} % {'below' if beyond > 0 else 'above'} it, within the tolerance {ref.tolerance_pct:g} %")
    return (f"not comparable: the machines' balance differs ({bal.dtype} matmul per byte of memory bandwidth "
            f"(triad) {bal.now:.3g} vs {bal.then:.3g} FLOP/B): at the same software a step all matmuls reads 1x "
            f"the reference's efficiency here, one all memory traffic {low:.2f}x; the {what} lies {where}")


def _kind(verdict: str, figures: dict[str, Any], ref: Reference) -> Optional[tuple[str, str]]:
    """(kind, what): ('regression', 'regression'), ('improvement', 'apparent improvement') ... where the verdict is a
    regression (an improvement), or insufficient data with its point estimate beyond the tolerance (an apparent
    one: its interval straddles the tolerance); None otherwise."""
    if "value" not in figures or "worse_pct" not in figures:
        return None
    if verdict in ("regression", "improvement"):
        return verdict, verdict
    if verdict == "insufficient data" and abs(figures["worse_pct"]) > ref.tolerance_pct:
        kind = "regression" if figures["worse_pct"] > 0 else "improvement"
        return kind, f"apparent {kind}"
    return None


def _explained(verdict: str, figures: dict[str, Any], ref: Reference, ratio: float,
               noise_pct: float) -> Optional[tuple[str, str]]:
    """(what, the change at the machine's speed: '+0.5 %') where the verdict is a regression (an
    improvement), or an apparent one (_kind), the speed (`ratio`, now over the reference's) is lower
    (higher) by more than `noise_pct` and at it the change lies within the tolerance; None otherwise."""
    kinded = _kind(verdict, figures, ref)
    if kinded is None:
        return None
    kind, what = kinded
    if not (ratio < 1 - noise_pct / 100 if kind == "regression" else ratio > 1 + noise_pct / 100):
        return None
    change = _beyond_range(figures, ref, ratio, ratio)   # the range of one point: the machine's speed
    return None if abs(change) > ref.tolerance_pct else (what, f"{(round(-change, 1) or 0.0):+.1f} %")
