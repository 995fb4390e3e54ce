"""Which collective an nccl-tests output measured: the *_perf binary it names, else the op given,
else inferred from the file name or from the results table, refusing when that is ambiguous.

Most outputs pasted in nccl-tests issues name no binary (older nccl-tests never prints it). The
table still tells a lot: busbw / algbw is nccl-tests' bus factor of the op at the run's rank count
(harness.collectives.busbw_factor); only all_reduce, reduce_scatter and reduce print a reduction in
the redop column (the others "none", blank or no column: <op>.cu passes "none"), and only broadcast
and reduce a root >= 0 (the others -1 or no column). all_gather and all_to_all share every clue,
so a table alone never tells them apart. No I/O.
"""
from __future__ import annotations

import math
import os
import re
from typing import Optional

from contract.collectives import BINARIES, OPS

from ..collectives import Row, busbw_factor
from ..errors import HarnessError

_OP_OF_BINARY = {b[:-len("_perf")]: op for op, b in BINARIES.items()}
BINARY_NAME = re.compile(r"(?<![\w-])(all_reduce|all_gather|reduce_scatter|alltoallv?|broadcast|reduce|"
                         r"sendrecv|gather|scatter|hypercube)_perf(?:_\w+)?\b")  # make NAME_SUFFIX=_mpi
# an op's name in a file name, with or without underscores (allreduce.log, reduce_scatter-8gpu.out);
# longest first, so the "reduce" of "allreduce" or "reduce_scatter" is not read as reduce
_FILE_OP = re.compile(r"(?<![a-z])(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|"
                      r"send_?recv|reduce)(?![a-z])", re.IGNORECASE)
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
_FACTOR = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
           "all_to_all": "(n-1)/n", "broadcast": "1", "reduce": "1", "sendrecv": "1"}  # for messages
_MAX_RANKS = 1 << 20


def op_of_binary(path: str) -> Optional[str]:
    """The collective of an nccl-tests binary path (all_reduce_perf, alltoall_perf_mpi, ...); None
    when the name is not exactly one binary this suite records."""
    names = [m.group(1) for m in BINARY_NAME.finditer(os.path.basename(path))]
    return _OP_OF_BINARY.get(names[0]) if len(names) == 1 else None


def op_of_file_name(path: str) -> Optional[str]:
    """The one collective a file's name spells (all_reduce_perf.txt, AllReduce.log, alltoall-16gpu.out),
    None when it names none or several."""
    keys = {m.group(1).lower().replace("_", "") for m in _FILE_OP.finditer(os.path.basename(path))}
    return {op.replace("_", ""): op for op in OPS}[keys.pop()] if len(keys) == 1 else None


def _half(value: float, json: bool) -> float:
    """Half the last printed digit: -J prints %lf; text %6.2f (util.cu getFloatStr: one or no
    decimal from 1000 GB/s on, an exponent from 1e6)."""
    if json:
        return 5e-7
    return 0.005 if value < 1000 else value * 5e-5 if value < 1e6 else value * 0.5


def ratio_bounds(rows: list[Row], json: bool) -> tuple[float, float, Optional[float]]:
    """(low, high) of busbw/algbw that every printed placement allows given its rounding, and the
    ratio of the placement with the largest algbw (None when no placement has a readable one)."""
    lo, hi, best, observed = 0.0, math.inf, 0.0, None
    for r in rows:
        for p in (r.out_of_place, r.in_place):
            if p is None or p.algbw_gbps is None or p.busbw_gbps is None:
                continue
            a, b = p.algbw_gbps, p.busbw_gbps
            ha, hb = _half(a, json), _half(b, json)
            if a - ha <= 0:
                continue
            lo, hi = max(lo, max(0.0, b - hb) / (a + ha)), min(hi, (b + hb) / (a - ha))
            if a > best:
                best, observed = a, b / a
    return lo * (1 - 1e-9), hi * (1 + 1e-9), observed


def _fits(op: str, lo: float, hi: float, num_ranks: Optional[int]) -> bool:
    """Whether op's bus factor lies in [lo, hi] at num_ranks, or at some rank count when unknown
    (every factor grows with n, so the smallest n reaching lo decides)."""
    if num_ranks:
        return lo <= busbw_factor(op, num_ranks) <= hi
    a, b = 1, _MAX_RANKS
    if busbw_factor(op, b) < lo:
        return False
    while a < b:
        mid = (a + b) // 2
        a, b = (mid + 1, b) if busbw_factor(op, mid) < lo else (a, mid)
    return busbw_factor(op, a) <= hi


def _factor_at(op: str, num_ranks: Optional[int]) -> str:
    if _FACTOR[op] == "1":
        return "1"
    at = f" = {busbw_factor(op, num_ranks):.4g} at {num_ranks} ranks" if num_ranks else " at any rank count"
    return _FACTOR[op] + at


def _table(rows: list[Row], num_ranks: Optional[int], observed: Optional[float]) -> str:
    if not rows:
        return "no result rows"
    redops = "/".join(sorted({r.redop or "none" for r in rows}))
    roots = "/".join(str(x) for x in sorted({r.root for r in rows}))
    ratio = "no busbw/algbw large enough to read" if observed is None else f"busbw/algbw {observed:.4g}"
    ranks = f"{num_ranks} ranks" if num_ranks else "rank count not printed"
    return f"redop {redops}, root {roots}, {ratio}, {ranks}"


def _misfits(rows: list[Row], num_ranks: Optional[int], json: bool) -> dict[str, str]:
    """Each collective the table rules out, with why."""
    lo, hi, _ = ratio_bounds(rows, json)
    redops = sorted({r.redop for r in rows} - {"none", ""})
    roots = sorted({r.root for r in rows if r.root >= 0})
    out = {}
    for op in OPS:
        if rows and (op in _REDUCING) != bool(redops):
            out[op] = (f"{op} prints its reduction in the redop column, the table none" if op in _REDUCING
                       else f"{op} has no reduction, the table shows redop {redops[0]}")
        elif rows and (op in _ROOTED) != bool(roots):
            out[op] = (f"{op} has a root >= 0, the table root -1" if op in _ROOTED
                       else f"{op} has no root (-1), the table shows root {roots[0]}")
        elif not _fits(op, lo, hi, num_ranks):
            out[op] = f"{op}'s bus factor {_factor_at(op, num_ranks)} is not the table's busbw/algbw"
    return out


RATIO = "busbw/algbw"
"""How an output's rank count was read when its Rank lines do not give it (ParsedOutput.ranks_from)."""


def ranks_from_ratio(op: str, rows: list[Row], json: bool, at_least: int = 2) -> Optional[int]:
    """The one rank count (>= at_least) whose bus factor of op lies within busbw/algbw as printed: an output cut
    to its last Rank line still tells a 72-rank all_reduce by its 1.972. None for an op whose factor does not
    depend on it, or when the rounding leaves more than one count (from a few hundred ranks on)."""
    limit = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}.get(op)
    lo, hi, observed = ratio_bounds(rows, json)
    if limit is None or observed is None or hi >= limit:
        return None
    first, last = max(at_least, math.ceil(limit / (limit - lo) - 1e-9)), math.floor(limit / (limit - hi) + 1e-9)
    fits = [n for n in range(first, min(last, _MAX_RANKS) + 1) if lo <= busbw_factor(op, n) <= hi]
    return fits[0] if len(fits) == 1 else None


def _ratio_check(op: str, rows: list[Row], num_ranks: Optional[int], json: bool, where: str) -> None:
    lo, hi, observed = ratio_bounds(rows, json)
    if _fits(op, lo, hi, num_ranks):
        return
    raise HarnessError(f"{where}: op={op!r} given but the table contradicts it: busbw/algbw is "
                       f"{observed:.4g} (between {lo:.5g} and {hi:.5g} as printed), not {op}'s bus factor "
                       f"{_factor_at(op, num_ranks)}")


def resolve_op(names: set[str], op: Optional[str], where: str, rows: list[Row],
               num_ranks: Optional[int], json: bool = False) -> tuple[str, Optional[str]]:
    """(collective, how it was inferred or None) from the *_perf binary names the output shows, the
    op argument (which must agree with them and with busbw/algbw), else the file name `where` (the
    table must fit it), else the table alone when exactly one collective fits it."""
    if op is not None and op not in OPS:
        raise HarnessError(f"{where}: op={op!r} is invalid; valid: {', '.join(OPS)}")
    ops = set()
    for name in names:
        if name not in _OP_OF_BINARY:
            raise HarnessError(f"{where}: {name}_perf is not a collective this suite records; "
                               f"valid binaries: {', '.join(BINARIES.values())}")
        ops.add(_OP_OF_BINARY[name])
    if op is not None:
        if ops and op not in ops:
            raise HarnessError(f"{where}: op={op!r} given but the output is from "
                               f"{', '.join(sorted(BINARIES[o] for o in ops))}")
        _ratio_check(op, rows, num_ranks, json, where)
        return op, None
    if len(ops) > 1:
        raise HarnessError(f"{where}: cannot tell which collective this is: the output names several "
                           f"binaries: {', '.join(sorted(BINARIES[o] for o in ops))}; pass --op "
                           f"(one of: {', '.join(OPS)})")
    if ops:
        return ops.pop(), None
    misfits = _misfits(rows, num_ranks, json)
    fits = [o for o in OPS if o not in misfits]
    table = _table(rows, num_ranks, ratio_bounds(rows, json)[2])
    by_name = op_of_file_name(where)
    if by_name is not None:
        if by_name in misfits:
            raise HarnessError(f"{where}: the file name says {by_name} but the table ({table}) does not "
                               f"fit it: {misfits[by_name]}; pass --op (one of: {', '.join(fits or OPS)})")
        return by_name, f"inferred from the file name {os.path.basename(where)!r}; the table agrees ({table})"
    if len(fits) == 1:
        return fits[0], f"inferred from the table ({table}): only {fits[0]} fits"
    what = (f"fits several collectives: {', '.join(fits)}" if fits else
            "fits none of the collectives: " + "; ".join(f"{o}: {why}" for o, why in misfits.items()))
    raise HarnessError(f"{where}: cannot tell which collective this is: the output does not name its binary "
                       f"(e.g. all_reduce_perf), nor does its file name, and its table ({table}) {what}; "
                       f"pass --op (one of: {', '.join(fits or OPS)})")
