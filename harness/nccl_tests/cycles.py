"""nccl-tests' run cycles (`-N,--run_cycles k`): one output holding k sweeps, each a run of its own.

common.cu TimeTest repeats the whole benchmark loop k times (`do { for (size = min; size <= max; ...) ... }
while (--repeat)`) into the same table, with no header or footer between the cycles, and its "Avg bus
bandwidth" averages every placement of every cycle; a -J output lists them in one "results" array the same
way. So a `-N 3` acceptance log is three runs of one configuration: three samples for submit and compare,
not one table whose sizes repeat. A cycle starts where a row's size is below the one before it (a sweep's
sizes rise); where they cannot (`-b` equal to `-e`: one size a cycle), every run of the rows per sweep the
header's -b/-e/-f|-i gives. Rows are kept as printed, split, never merged or averaged. No I/O."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from .output import ErrorValue, ParsedOutput, RunConfig

MAX_SIZES = 100_000
"""More sizes than any sweep has: a header that would give more is not believed (a step of 0 bytes)."""


def rows_per_cycle(rc: Optional[RunConfig]) -> Optional[int]:
    """The sizes one sweep of the header's -b/-e/-f|-i runs (common.cu TimeTest's loop); None unknown."""
    if rc is None or rc.min_bytes > rc.max_bytes:
        return None
    factor, step = rc.step_factor or 0, rc.step_bytes or 0
    if factor <= 1 and step <= 0 or rc.min_bytes <= 0 and factor > 1:
        return None
    n, size = 0, rc.min_bytes
    while size <= rc.max_bytes and n < MAX_SIZES:
        n += 1
        size = size * factor if factor > 1 else size + step
    return n if n < MAX_SIZES else None


def _bounds(parsed: ParsedOutput) -> list[int]:
    """Where each cycle's rows start: at a size below the row before's; else every rows_per_cycle rows
    where the rows are a whole number (two or more) of sweeps of equal sizes."""
    sizes = [r.size_bytes for r in parsed.rows]
    starts = [0] + [i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1]]
    n = rows_per_cycle(parsed.run_config)
    if len(starts) == 1 and n and len(sizes) >= 2 * n and len(sizes) % n == 0 \
            and all(sizes[i] == sizes[i % n] for i in range(len(sizes))):
        starts = list(range(0, len(sizes), n))
    return starts


def split_cycles(parsed: ParsedOutput) -> list[ParsedOutput]:
    """The output's cycles, each a ParsedOutput of its rows (one: [parsed] itself). A cycle is complete when it
    has the sweep's every size, and the last only when the output is (its footer printed, nothing dropped); the
    footer's "Avg bus bandwidth" is every cycle's (kept as printed: a cycle's record averages its own rows,
    importer.records_from_output). What nccl-tests reports for the whole run (out of bounds, a FAILED average,
    failures) stays on each."""
    starts = _bounds(parsed)
    if len(starts) == 1:
        return [parsed]
    n = rows_per_cycle(parsed.run_config)
    ends = starts[1:] + [len(parsed.rows)]
    errors = parsed.errors if len(parsed.errors) == len(parsed.rows) else []
    out = []
    for k, (a, b) in enumerate(zip(starts, ends)):
        last = k == len(starts) - 1
        whole = (n is None or b - a == n) and (parsed.complete or not last)
        cycle_errors: list[ErrorValue] = errors[a:b]
        out.append(replace(parsed, rows=parsed.rows[a:b], errors=cycle_errors, complete=whole,
                           num_dropped_rows=parsed.num_dropped_rows if last else 0,
                           wall_s=parsed.wall_s / len(starts) if parsed.wall_s else parsed.wall_s))
    return out
