"""Changes the machine explains: a regression (an improvement) of a metric that moves with the machine's speed or
the CPU time its ranks got, read "not comparable" where the measured pace (the pulse) or the CPU share puts the
change within the tolerance (compare.judge asks these before it says regression)."""
from __future__ import annotations

from typing import Any, Optional

from ..probe import PACE_NOISE_PCT, Pace, Share
from .references import Reference


def worse_pct(current: float, reference: float, direction: str) -> float:
    change = 100.0 * (current - reference) / reference
    return -change if direction == "higher" else change


def at_machine_pace(verdict: str, figures: dict[str, Any], ref: Reference, paces: Optional[Pace]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement; or an apparent one, insufficient data
    whose point estimate lies beyond the tolerance) of a metric that moves with the machine's speed is
    the machine's own: this run's pulse read the machine slower (faster) than the
    reference's pace by more than the pulse's noise (PACE_NOISE_PCT), and at the machine's measured
    pace the change lies within the tolerance. None otherwise: a change beyond what the machine's
    pace explains stays a regression, and a run with no pulse is judged as before."""
    if paces is None:
        return None
    now, then, unit, device = paces
    explained = _explained(verdict, figures, ref, now / then, PACE_NOISE_PCT.get(device, PACE_NOISE_PCT["cpu"]))
    if explained is None:
        return None
    what, change = explained
    return (f"not comparable: the machine ran {abs(1 - now / then) * 100:.0f} % "
            f"{'slower' if now < then else 'faster'} during this run than the reference's (fp32 matmul {now:.3g} vs "
            f"{then:.3g} {unit}, this run's pulse); at its own pace the {what} is a change of {change}, within the "
            f"tolerance {ref.tolerance_pct:g} %")


def at_cpu_share(verdict: str, figures: dict[str, Any], ref: Reference, share: Optional[Share]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement) of a metric that moves with the CPU time the
    ranks get is the other work's on a cpu machine: the ranks got less (more) CPU time than the reference's
    by more than the pace's noise while other work took a material share of the machine (probe.cpu_share),
    and at the CPU time they got the change lies within the tolerance. The pulse misses such a neighbour:
    it times one core while the node's other ranks wait, and one busy neighbour on a 2-core box leaves
    that core free. Measured on the 2-core AVX2 EPYC with a unit-test run beside a default-cpu bench:
    other work 0.63-0.78 CPUs, the ranks 1.19-1.32 CPUs against the references' 1.82-1.89, the runs at
    0.64-0.82x their samples/s, the pulses at 1.1x the references' probe."""
    if share is None:
        return None
    ratio = share.now / share.then
    explained = _explained(verdict, figures, ref, ratio, PACE_NOISE_PCT["cpu"])
    if explained is None:
        return None
    what, change = explained
    return (f"not comparable: other work took {share.other_now:.2f} of the machine's {share.cpus} CPUs while this "
            f"run measured (the reference's {share.other_then:.2f}), and its ranks got {ratio:.2f}x the reference's "
            f"CPU time ({share.now:.2f} vs {share.then:.2f} CPUs); at that share the {what} is a change of "
            f"{change}, within the tolerance {ref.tolerance_pct:g} %")


def _explained(verdict: str, figures: dict[str, Any], ref: Reference, ratio: float,
               noise_pct: float) -> Optional[tuple[str, str]]:
    """(what, the change at the machine's speed: '+0.5 %') where the verdict is a regression (an
    improvement), or insufficient data with its point estimate beyond the tolerance (an apparent one:
    its interval straddles the tolerance), the speed (`ratio`, now over the reference's) is lower
    (higher) by more than `noise_pct` and at it the change lies within the tolerance; None otherwise."""
    if "value" not in figures or "worse_pct" not in figures:
        return None
    if verdict in ("regression", "improvement"):
        kind, what = verdict, verdict
    elif verdict == "insufficient data" and abs(figures["worse_pct"]) > ref.tolerance_pct:
        kind = "regression" if figures["worse_pct"] > 0 else "improvement"
        what = f"apparent {kind}"
    else:
        return None
    if not (ratio < 1 - noise_pct / 100 if kind == "regression" else ratio > 1 + noise_pct / 100):
        return None
    at_speed = figures["value"] / ratio if ref.direction == "higher" else figures["value"] * ratio
    change = worse_pct(at_speed, ref.value, ref.direction)
    return None if abs(change) > ref.tolerance_pct else (what, f"{(round(-change, 1) or 0.0):+.1f} %")
