"""The waiting in a training run's measured communication: each profiled collective is timed on its own
(benchmarks/training/instrument.py), so a call that took over STALL_FACTOR times the lower quartile of its kind (op
and bytes, over every profiled micro-step of the run) was held up, for the host's scheduler or for a peer still
computing, and its time beyond that quartile is waiting, not data moving (contract/collectives.py held_up_excess).

On the 2-core Zen 5 box, by that rule on whole calls, 24 llama-tiny ZeRO-3 runs spent 17-56 % of their profiled
communication time so (18-51 % of their calls held up, most for 2-6 ms); 32 ZeRO-1/2 runs, with a few large calls a
step, 0-22 %. With the peer's wait measured (below), 12 ZeRO-3 runs 32-57 %, 11-35 % for the other rank; 16 ZeRO-1/2
runs 1-37 % (docs/measurement.md, "Held-up communication").

Where the ranks' calls were matched (benchmarks/training/arrivals.py), each call carries `peer_wait_s`, the time it
waited for the latest rank to reach it, measured, not inferred: that is waiting for a peer (rank skew, a straggler),
whether or not the call passed the quartile rule (a rank late to every micro-step makes every call of a kind slow
alike, and their quartile with them). The rule then looks only at the rest of each call, from the last arrival to
its exit, for the host's stalls (a thread not run, a copy slowed by a neighbour); the waiting is the two together."""
from __future__ import annotations

from typing import Any, Optional

from contract.collectives import held_up_excess

from .pace import slow_device


Steps = list[list[dict[str, Any]]]


def _calls(microsteps: Steps) -> list[dict[str, Any]]:
    return [c for step in microsteps for m in step for c in m["collectives"]]


def _per_microstep(microsteps: Steps, values: list[float]) -> list[list[float]]:
    each = iter(values)
    return [[sum(next(each) for _ in m["collectives"]) for m in step] for step in microsteps]


def _waits(microsteps: Steps) -> tuple[Optional[list[float]], list[float]]:
    """Per call in order: (its wait for a peer, or None for all where a call lacks peer_wait_s; its host stall)."""
    calls = _calls(microsteps)
    if calls and all("peer_wait_s" in c for c in calls):
        peer = [min(c["peer_wait_s"], c["time_s"]) for c in calls]
        return peer, held_up_excess([((c["op"], c["bytes"]), c["time_s"] - w) for c, w in zip(calls, peer)])
    return None, held_up_excess([((c["op"], c["bytes"]), c["time_s"]) for c in calls])


def held_up_s(microsteps: Steps) -> list[list[float]]:
    """Seconds of waiting in each micro-step of each profiled step (the record's `microsteps`, same shape)."""
    peer, host = _waits(microsteps)
    return _per_microstep(microsteps, host if peer is None else [p + h for p, h in zip(peer, host)])


def for_peer_s(microsteps: Steps) -> Optional[list[list[float]]]:
    """Of held_up_s, the seconds spent waiting for a peer to reach the call (the rest was the host's); None where a
    call carries no peer_wait_s (a single rank, calls not matched, a record from before it was measured)."""
    peer, _ = _waits(microsteps)
    return None if peer is None else _per_microstep(microsteps, peer)


def _share(microsteps: Steps, seconds: Optional[list[list[float]]]) -> Optional[float]:
    """Per-micro-step seconds as a share (%) of the profiled communication time; None without either."""
    total = sum(c["time_s"] for c in _calls(microsteps))
    return None if seconds is None or total <= 0 else 100.0 * sum(sum(step) for step in seconds) / total


def comm_held_up_pct(microsteps: Steps) -> Optional[float]:
    """The share of the profiled steps' communication time that was waiting; None without a timed collective."""
    return _share(microsteps, held_up_s(microsteps))


def comm_held_up_for_peer_pct(microsteps: Steps) -> Optional[float]:
    """The share of the profiled steps' communication time spent waiting for a later peer (part of
    comm_held_up_pct); None where it was not told apart."""
    return _share(microsteps, for_peer_s(microsteps))


def stragglers(steps: list[dict[str, Any]], per: str = "ranks") -> list[dict[str, Any]]:
    """Per rank (per="hosts": per host, with its ranks, where the run spanned hosts) over the profiled steps whose
    calls were matched (the record's `steps`, their `arrivals`): how many calls it came last to, of how many, and the
    seconds it held the others back; the most held back first."""
    key = "rank" if per == "ranks" else "host"
    found: dict[Any, dict[str, Any]] = {}
    calls = 0
    for s in steps:
        came = s.get("arrivals") or {}
        calls += came.get("calls", 0)
        for r in came.get(per, ()):
            one = found.setdefault(r[key], {**{k: v for k, v in r.items() if k not in ("last_calls", "held_back_s")},
                                            "last_calls": 0, "held_back_s": 0.0})
            one["last_calls"] += r["last_calls"]
            one["held_back_s"] += r["held_back_s"]
    return sorted(({**one, "calls": calls} for one in found.values()), key=lambda one: -one["held_back_s"])


STRAGGLER_PCT = 15.0
"""A rank stands out as a straggler when it held the others back this share of the profiled steps' time or more,
and STRAGGLER_RATIO times the next rank's share. On the 2-core Zen 5 box the default suite's 28 quiet llama-tiny
runs (2026-12-06) read 1-11 % for their latest rank, 0-6 % for the next (at most 8 points apart: two ranks on two
cores late by turns); one rank sleeping 0.15 s a micro-step read 47 % against 3 %, on the emulated 2-node cluster
0.1 s a micro-step 20 % against 2 %."""
STRAGGLER_RATIO = 3.0


def _profiled_s(steps: list[dict[str, Any]]) -> float:
    """The time of the profiled steps whose calls were matched: what a held-back share is a share of."""
    return sum(s["step_time_s"] for s in steps if s.get("mode") == "profile" and s.get("arrivals", {}).get("ranks"))


def shares(steps: list[dict[str, Any]], per: str = "ranks") -> dict[Any, float]:
    """{rank (per="hosts": host): the % of the profiled steps' time it held the others back}, every one of them
    (straggler() keeps the first and the next); {} where no profiled step's calls were matched."""
    total = _profiled_s(steps)
    key = "rank" if per == "ranks" else "host"
    return {one[key]: 100.0 * one["held_back_s"] / total for one in stragglers(steps, per)} if total > 0 else {}


def straggler(steps: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The rank that held the others back most over the profiled steps (stragglers()), as a share of their time:
    {rank, host, held_back_pct, next_pct, stands_out}; where no rank stands out but a host does (a slow node, its
    ranks late together: each leads the next latest, its neighbour, by nothing), that host with its ranks instead:
    {host, ranks, held_back_pct, next_pct, stands_out}. None where no profiled step's calls were matched."""
    total = _profiled_s(steps)
    if total <= 0:
        return None
    rank, node = (_share_of(stragglers(steps, per), total) for per in ("ranks", "hosts"))
    return node if rank and not rank["stands_out"] and node and node["stands_out"] else rank


def _share_of(ranked: list[dict[str, Any]], total: float) -> Optional[dict[str, Any]]:
    """The first of stragglers()'s list as a share of the profiled time, against the next; None when empty."""
    if not ranked:
        return None
    top = 100.0 * ranked[0]["held_back_s"] / total
    following = 100.0 * ranked[1]["held_back_s"] / total if len(ranked) > 1 else 0.0
    who = {k: ranked[0][k] for k in ("rank", "host", "ranks") if k in ranked[0]}
    return {**who, "held_back_pct": round(top, 2), "next_pct": round(following, 2),
            "stands_out": top >= STRAGGLER_PCT and top >= STRAGGLER_RATIO * following}


def who(found: dict[str, Any]) -> str:
    """'rank 1 (node1)', or a node: 'node node1 (ranks 2, 3)'."""
    return (f"rank {found['rank']} ({found['host']})" if "rank" in found else
            f"node {found['host']} (ranks {', '.join(map(str, found['ranks']))})")


def straggler_words(found: Optional[dict[str, Any]]) -> str:
    """How a comparison names a run's straggler (a rank, or a node whose ranks came late together), or says none
    stood out."""
    if not found:
        return "not measured"
    held = f"{who(found)} held the others back {found['held_back_pct']:.0f} % of the profiled steps"
    return held if found["stands_out"] else f"none stood out ({held}, the next {found['next_pct']:.0f} %)"


def slow_device_words(env: Optional[dict[str, Any]], found: dict[str, Any]) -> str:
    """', its device the slowest read at once (0.52x the fastest)' where the straggler is a rank whose own device's
    pulse, every rank's read at once, was the run's slowest beyond the pulse's noise (harness/pace.py slow_device): a
    GPU (a vCPU) that ran slower, not the software; '' otherwise."""
    slow = slow_device(env)
    if slow is None or "rank" not in found or slow[0] != found["rank"]:
        return ""
    return f", its device the slowest read at once ({slow[2]:.2f}x the fastest)"


def _stood_out(records: list) -> dict[str, tuple[list, list[dict[str, Any]]]]:
    """{run id: (its repeats' records, the stragglers that stood out in them)} of the runs in which a straggler stood
    out in most of their repeats."""
    by_run: dict[str, list] = {}
    for r in records:
        by_run.setdefault(r.run_id, []).append(r)
    out = {}
    for run_id, recs in by_run.items():
        stood = [s for s in ((r.environment.get("load") or {}).get("straggler") for r in recs)
                 if s and s.get("stands_out")]
        if 2 * len(stood) > len(recs):
            out[run_id] = (recs, stood)
    return out


def standing_out(records: list) -> set[str]:
    """The run ids night_stragglers names: a straggler stood out in most of their repeats."""
    return set(_stood_out(records))


def night_stragglers(records: list, trends: Optional[dict[str, str]] = None) -> list[str]:
    """The runs of the night in which one rank stood out as the straggler (environment.load.straggler:
    straggler() above) in most of its repeats, one line per run id: the worst repeat's words, in how many of its
    repeats, and every rank (host) that stood out where it was not always the same. Whatever the verdicts: a node
    that begins to lag shows here before its lag costs a metric its tolerance (the nightly's --fail-on straggler fails
    on it). One repeat in three is a spell of the host, not a straggler: on the 2-core AVX2 EPYC (2026-12-07) a quiet
    llama-tiny run's latest rank (either) read 0-17 % of the profiled steps in the cpu nightly, and stood out in 2 of
    its 12 quiet records, each in 1 of its night's 3 repeats, so every quiet night failed --fail-on straggler; a
    rank that sleeps each micro-step stands out in every repeat. With one repeat (--repeats 1) that one decides.
    trends: {run id: how its straggler rose over the last nights} (harness/straggler_trend.py), added to its line."""
    out = []
    for run_id, (recs, stood) in _stood_out(records).items():
        worst = max(stood, key=lambda s: s["held_back_pct"])
        names = sorted({who(s) for s in stood})
        of = next(r for r in recs if (r.environment.get("load") or {}).get("straggler") is worst)
        out.append(f"{run_id} ({recs[0].benchmark}): {straggler_words(worst)}"
                   f"{slow_device_words(of.environment, worst)}, in {len(stood)} of {len(recs)} runs"
                   + (f"; by turns {', '.join(names)}" if len(names) > 1 else "")
                   + (f"; {trends[run_id]}" if trends and run_id in trends else ""))
    return out
