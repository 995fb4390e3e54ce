"""nccl-tests (github.com/NVIDIA/nccl-tests) output: text layouts and -J JSON, parsed into rows.

Formats read (where each comes from: tests/data/nccl_tests/README.md):
- text, layout "old" (before v2.13): a per-op column header (all_gather and sendrecv have no redop
  column, only broadcast and reduce a root column; alltoall prints a blank redop) and an "error"
  column, the largest deviation from the expected values (a float, 0e+00, or N/A without -c);
- text, layout "new" (v2.13+): redop and root on every op (-1 when the op has none), "#wrong"
  columns (elements that failed the check, N/A without -c), optional timestamp and per-iteration
  columns;
- JSON written by `-J FILE.json`: harness/nccl_tests/json_format.py (with parse_file, which reads either).
Rows keep what nccl-tests printed (time in us, GB/s = 1e9 B/s); a row cut short is dropped, never
repaired. Which collective it is: harness.nccl_tests.infer. No I/O; no torch.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from ..collectives import Placement, Row
from ..errors import HarnessError
from .infer import BINARY_NAME, RATIO, ranks_from_ratio, resolve_op

_TAG = re.compile(r"^\[\d+,\d+\]<(?:stdout|stderr)>:")  # mpirun --tag-output
_STARTING = re.compile(r"Collective test (?:starting|concluded):\s*(\S+)")
_NCCL_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda(\d+\.\d+))?")
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+) nccl-headers=\d+ nccl-library=(\d+)")
_NTHREAD = re.compile(r"nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\)"
                      r" warmup iters: (\d+) iters: (\d+)(?: agg iters: (\d+))? validation: (\d+)"
                      r"(?: graph: (\d+))?")
_RANK = re.compile(r"Rank\s+(\d+)(?:\s+Group\s+(\d+))?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                   r"\[[^\]]*\]\s+(.+?)\s*$")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_FAILURE = re.compile(r"(?:\S*:\s+Test (?:NCCL |CUDA )?failure|\S*:\s+Test timeout|\.\. \S+ pid \d+: "
                      r"Test failure).*")


@dataclass
class RunConfig:
    """How nccl-tests ran: its "# nThread ..." header line or the JSON "config" object."""
    num_threads: int
    num_gpus: int
    """GPUs per thread (-g)."""
    min_bytes: int
    max_bytes: int
    step_factor: Optional[int]
    step_bytes: Optional[int]
    warmup_iters: int
    iters: int
    agg_iters: Optional[int]
    check_iters: int
    """-c: 0 = no correctness check (N/A columns)."""
    graph_launches: Optional[int]


@dataclass
class ErrorValue:
    """The old layout's "error" columns of one row; None where nccl-tests printed N/A."""
    size_bytes: int
    out_of_place: Optional[float]
    in_place: Optional[float]


@dataclass
class ParsedOutput:
    source: str
    op: str
    layout: str
    """"old" or "new" text column layout, or "json" (-J)."""
    rows: list[Row]
    complete: bool
    """False when the footer ("Avg bus bandwidth") is missing or a row was cut (and dropped)."""
    num_ranks: Optional[int] = None
    """Ranks of one communicator, from the Rank lines (JSON: threads x GPUs x processes)."""
    avg_busbw_gbps: Optional[float] = None
    """nccl-tests' printed "Avg bus bandwidth" (mean of the unrounded busbw), None if absent."""
    avg_busbw_failed: bool = False
    """The footer says FAILED: below NCCL_TESTS_MIN_BW."""
    out_of_bounds: Optional[int] = None
    errors: list[ErrorValue] = field(default_factory=list)
    """Old layout only: the error column of each kept row (its num_wrong are None)."""
    devices: list[str] = field(default_factory=list)
    """Device names from the Rank lines, one per rank (JSON: the first device of each process)."""
    hosts: list[str] = field(default_factory=list)
    nccl_version: Optional[str] = None
    cuda_version: Optional[str] = None
    nccl_tests_version: Optional[str] = None
    run_config: Optional[RunConfig] = None
    args: list[str] = field(default_factory=list)
    """JSON: nccl-tests' argv."""
    env: dict[str, str] = field(default_factory=dict)
    """JSON: the NCCL_* and related variables of the writing process."""
    num_dropped_rows: int = 0
    failures: list[str] = field(default_factory=list)
    """What nccl-tests reported going wrong: "Test NCCL failure ..." lines, "# error: ...", JSON errors."""
    wall_s: Optional[float] = None
    op_inferred: Optional[str] = None
    """How op was inferred when the output names no binary and none was given (file name or table)."""
    ranks_from: Optional[str] = None
    """Where num_ranks comes from: "rank lines", "json", or infer.RATIO when the Rank lines are cut short
    (the hosts they name are then only some of the run's)."""


# --- shared helpers ---------------------------------------------------------------------------

def nccl_version_of(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.21.5" (major*10000+minor*100+patch since 2.9, *1000 before)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def num_ranks_of(ranks: list[tuple[int, int]]) -> Optional[int]:
    """Ranks per communicator from (rank, group) pairs: all of 0..N-1 seen once, equal groups."""
    ids = sorted(r for r, _ in ranks)
    if not ids or ids != list(range(len(ids))):
        return None
    sizes = {g: sum(1 for _, gg in ranks if gg == g) for _, g in ranks}
    return sizes.popitem()[1] if len(set(sizes.values())) == 1 else None


def finite_number(value: Any, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise HarnessError(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise HarnessError(f"{what}: {value!r} is not a finite non-negative number")
    return x


# --- text -------------------------------------------------------------------------------------

@dataclass
class _Columns:
    prefix: list[str]
    """Columns before the first time column: size, count, type[, redop][, root]."""
    placement: list[str]
    """One placement's columns: time, algbw, busbw, #wrong|error[, i_min, i_max, i_p99, i_cv%]."""
    timestamp: bool

    @property
    def layout(self) -> str:
        return "new" if self.placement[3] == "#wrong" else "old"


def _columns(tokens: list[str], where: str) -> _Columns:
    times = [i for i, t in enumerate(tokens) if t in ("time", "cputime")]
    ok = len(times) == 2 and tokens[:3] == ["size", "count", "type"]
    if ok:
        prefix, first, second = tokens[:times[0]], tokens[times[0]:times[1]], tokens[times[1]:]
        timestamp = second[-1:] == ["timestamp"]
        second = second[:-1] if timestamp else second
        ok = (first == second and len(first) >= 4 and first[1:3] == ["algbw", "busbw"]
              and first[3] in ("#wrong", "error") and set(prefix[3:]) <= {"redop", "root"})
    if not ok:
        raise HarnessError(f"{where}: unrecognised nccl-tests column header: {' '.join(tokens)}")
    return _Columns(prefix, first, timestamp)


class _CutRow(Exception):
    """A row with fewer fields than the header requires (cut short)."""


def _parse_row(tokens: list[str], cols: _Columns, where: str) -> tuple[Row, Optional[ErrorValue]]:
    it = iter(tokens)

    def take() -> str:
        tok = next(it, None)
        if tok is None:
            raise _CutRow
        return tok

    def integer(name: str) -> int:
        tok = take()
        if not re.fullmatch(r"-?\d+", tok):
            raise HarnessError(f"{where}: {name} {tok!r} is not an integer")
        return int(tok)

    size, count, dtype = integer("size"), integer("count"), take()
    redop, root = "none", -1
    pending: Optional[str] = None
    for name in cols.prefix[3:]:
        if name == "redop":
            tok = take()
            if re.fullmatch(r"[\d.eE+-]+", tok):  # alltoall before v2.13 prints a blank redop
                pending = tok
            else:
                redop = tok
        else:
            root = integer("root")
    places, errs = [], []
    for place in ("out-of-place", "in-place"):
        values = []
        for _ in cols.placement:
            tok, pending = (pending, None) if pending is not None else (take(), None)
            values.append(tok)
        time_us, alg, bus = (finite_number(v, f"{where}: {place} {n}") for v, n in zip(values[:3], cols.placement))
        wrong_tok = values[3]
        if cols.layout == "old":
            errs.append(None if wrong_tok == "N/A" else finite_number(wrong_tok.rstrip("*"), f"{where}: error"))
            wrong = None
        else:
            if wrong_tok != "N/A" and not re.fullmatch(r"\d+|\d(?:\.\d+)?e\+\d+", wrong_tok):  # %g of a count
                raise HarnessError(f"{where}: {place} #wrong {wrong_tok!r} is not a count")
            wrong = None if wrong_tok == "N/A" else int(float(wrong_tok))
        for v, n in zip(values[4:], cols.placement[4:]):
            finite_number(v, f"{where}: {place} {n}")
        places.append(Placement(time_us, alg, bus, wrong))
    if cols.timestamp:
        take(), take()
    extra = list(it)
    if extra:
        raise HarnessError(f"{where}: {len(extra)} more fields than the column header has: {' '.join(extra)}")
    error = ErrorValue(size, errs[0], errs[1]) if cols.layout == "old" else None
    return Row(size, count, dtype, redop, root, places[0], places[1]), error


def parse_text(text: str, source: str = "<text>", op: Optional[str] = None) -> ParsedOutput:
    """nccl-tests' stdout (either layout; mpirun --tag-output prefixes are stripped)."""
    lines = text.replace("\r\n", "\n").split("\n")
    unterminated = len(lines) - 1 if lines[-1].strip() else None  # a last line without "\n"
    cols: Optional[_Columns] = None
    rows: list[Row] = []
    errors: list[ErrorValue] = []
    binaries: set[str] = set()
    starting: set[str] = set()
    ranks: list[tuple[int, int]] = []
    devices, hosts, failures = [], [], []
    out = ParsedOutput(source, "", "", [], False)
    footer = False
    for i, raw in enumerate(lines):
        line = _TAG.sub("", raw)
        where = f"{source}:{i + 1}"
        if m := _NCCL_VERSION.search(line):
            out.nccl_version, out.cuda_version = m.group(1), m.group(2) or out.cuda_version
        binaries.update(m.group(1) for m in BINARY_NAME.finditer(line))
        s = line.strip()
        if not s.startswith("#"):
            fail = _FAILURE.search(line)
            if fail:
                failures.append(fail.group(0).strip())
            head = (line[:fail.start()] if fail else line).split()
            if cols is None or footer or not head or not re.fullmatch(r"\d+", head[0]):
                continue
            try:
                if fail or i == unterminated:
                    raise _CutRow
                row, error = _parse_row(head, cols, where)
            except _CutRow:
                out.num_dropped_rows += 1
                continue
            rows.append(row)
            if error:
                errors.append(error)
            continue
        body = s[1:].strip()
        tokens = body.split()
        if m := _STARTING.search(body):
            starting.update(b.group(1) for b in BINARY_NAME.finditer(m.group(1)))
        elif m := _TESTS_VERSION.match(body):
            out.nccl_tests_version = m.group(1)
            out.nccl_version = out.nccl_version or nccl_version_of(int(m.group(2)))
        elif m := _NTHREAD.match(body):
            g = [int(x) if x and x.isdigit() else x for x in m.groups()]
            out.run_config = RunConfig(g[0], g[1], g[2], g[3], g[4] if g[5] == "factor" else None,
                                       g[4] if g[5] == "bytes" else None, g[6], g[7], g[8], g[9], g[10])
        elif m := _RANK.match(body):
            ranks.append((int(m.group(1)), int(m.group(2) or 0)))
            hosts.append(m.group(3))
            devices.append(m.group(4))
        elif tokens[:3] == ["size", "count", "type"]:
            if cols is not None:
                raise HarnessError(f"{where}: a second results table starts here (several runs in one "
                                   "file, or several processes each printing as rank 0?); split the file")
            cols = _columns(tokens, where)
        elif m := _OOB.match(body):
            out.out_of_bounds = int(m.group(1))
        elif (m := _AVG.match(body)) and (i != unterminated or line[-1:].isspace() or m.group(2)):
            footer = True  # a last line without "\n" counts only if whole ("%g %s\n" ends in " " or OK)
            avg = float(m.group(1)) if re.fullmatch(r"[-+]?[\d.]+(?:e[-+]?\d+)?", m.group(1)) else None
            out.avg_busbw_gbps, out.avg_busbw_failed = avg, m.group(2) == "FAILED"
        elif body.startswith("error:"):
            failures.append(body)
    if cols is None:
        raise HarnessError(f"{source}: not nccl-tests output: no column header "
                           "('#  size  count  type ...') found")
    out.layout, out.rows, out.errors, out.failures = cols.layout, rows, errors, failures
    out.complete = footer and out.num_dropped_rows == 0
    out.num_ranks, out.devices, out.hosts = num_ranks_of(ranks), devices, sorted(set(hosts))
    out.op, out.op_inferred = resolve_op(starting or binaries, op, source, rows, out.num_ranks)
    out.ranks_from = "rank lines" if out.num_ranks else None
    if out.num_ranks is None:   # Rank lines cut short (a pasted tail): the table's bus factor may still say
        out.num_ranks = ranks_from_ratio(out.op, rows, False, at_least=max((r + 1 for r, _ in ranks), default=2))
        out.ranks_from = RATIO if out.num_ranks else None
    return out
