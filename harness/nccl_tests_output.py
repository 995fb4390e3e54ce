"""nccl-tests (github.com/NVIDIA/nccl-tests) output: text layouts and -J JSON, parsed into rows.

Formats read (where each comes from: tests/data/nccl_tests/README.md):
- text, layout "old" (before v2.13): a per-op column header (all_gather and sendrecv have no redop
  column, only broadcast and reduce a root column; alltoall prints a blank redop) and an "error"
  column, the largest deviation from the expected values (a float, 0e+00, or N/A without -c);
- text, layout "new" (v2.13+): redop and root on every op (-1 when the op has none), "#wrong"
  columns (elements that failed the check, N/A without -c), optional timestamp and per-iteration
  columns;
- JSON written by `-J FILE.json` (src/util.cu, JSON_FILE_VERSION 1 and 2), layout "json".
Rows keep what nccl-tests printed (time in us, GB/s = 1e9 B/s); a row cut short is dropped, never
repaired. Which collective it is: harness.nccl_tests_infer. I/O only in parse_file; no torch.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Union

from contract.fingerprint import ENV_PREFIXES

from .collectives import Placement, Row
from .errors import HarnessError
from .nccl_tests_infer import BINARY_NAME, resolve_op

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


# --- shared helpers ---------------------------------------------------------------------------

def _nccl_version_of(code: int) -> str:
    """NCCL_VERSION_CODE -> "2.21.5" (major*10000+minor*100+patch since 2.9, *1000 before)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _num_ranks(ranks: list[tuple[int, int]]) -> Optional[int]:
    """Ranks per communicator from (rank, group) pairs: all of 0..N-1 seen once, equal groups."""
    ids = sorted(r for r, _ in ranks)
    if not ids or ids != list(range(len(ids))):
        return None
    sizes = {g: sum(1 for _, gg in ranks if gg == g) for _, g in ranks}
    return sizes.popitem()[1] if len(set(sizes.values())) == 1 else None


def _finite(value: Any, what: str) -> float:
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
        time_us, alg, bus = (_finite(v, f"{where}: {place} {n}") for v, n in zip(values[:3], cols.placement))
        wrong_tok = values[3]
        if cols.layout == "old":
            errs.append(None if wrong_tok == "N/A" else _finite(wrong_tok.rstrip("*"), f"{where}: error"))
            wrong = None
        else:
            if wrong_tok != "N/A" and not re.fullmatch(r"\d+|\d(?:\.\d+)?e\+\d+", wrong_tok):  # %g of a count
                raise HarnessError(f"{where}: {place} #wrong {wrong_tok!r} is not a count")
            wrong = None if wrong_tok == "N/A" else int(float(wrong_tok))
        for v, n in zip(values[4:], cols.placement[4:]):
            _finite(v, f"{where}: {place} {n}")
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
            out.nccl_version = out.nccl_version or _nccl_version_of(int(m.group(2)))
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
    out.num_ranks, out.devices, out.hosts = _num_ranks(ranks), devices, sorted(set(hosts))
    out.op, out.op_inferred = resolve_op(starting or binaries, op, source, rows, out.num_ranks)
    return out


# --- JSON (-J) --------------------------------------------------------------------------------

def _json_prefix(text: str, source: str) -> tuple[dict[str, Any], int]:
    """The top-level keys of a JSON document cut short, each value only if whole, the "results"
    list element by element; and 1 if it ends inside a result object. Nothing is invented."""
    dec = json.JSONDecoder()
    ws = re.compile(r"\s*")
    out: dict[str, Any] = {}
    partial = 0
    pos = ws.match(text, 0).end()
    if not text.startswith("{", pos):
        raise HarnessError(f"{source}: not nccl-tests output: neither text nor a JSON object")
    pos += 1
    try:
        while True:
            pos = ws.match(text, pos).end()
            key, pos = dec.raw_decode(text, pos)
            pos = ws.match(text, pos).end()
            if not text.startswith(":", pos):
                break
            pos = ws.match(text, pos + 1).end()
            if key == "results" and text.startswith("[", pos):
                out[key] = items = []
                pos += 1
                while True:
                    pos = ws.match(text, pos).end()
                    if text.startswith("]", pos):
                        pos += 1
                        break
                    try:
                        item, pos = dec.raw_decode(text, pos)
                    except json.JSONDecodeError:
                        partial = int(text.startswith("{", pos))
                        raise
                    items.append(item)
                    pos = ws.match(text, pos).end()
                    if text.startswith(",", pos):
                        pos += 1
            else:
                out[key], pos = dec.raw_decode(text, pos)
            pos = ws.match(text, pos).end()
            if not text.startswith(",", pos):
                break
            pos += 1
    except json.JSONDecodeError:
        pass
    return out, partial


def _placement(obj: Any, what: str) -> Placement:
    if not isinstance(obj, dict):
        raise HarnessError(f"{what}: expected an object, got {obj!r}")
    time_key = "time" if "time" in obj else "cpu_time"
    vals = [_finite(obj.get(k), f"{what}.{k}") for k in (time_key, "alg_bw", "bus_bw")]
    wrong = obj.get("nwrong")
    return Placement(*vals, None if wrong is None else int(round(_finite(wrong, f"{what}.nwrong"))))


def parse_json(obj_or_text: Union[str, bytes, dict], source: str = "<json>",
               op: Optional[str] = None) -> ParsedOutput:
    """The JSON nccl-tests writes with -J FILE.json (src/util.cu). A document cut short keeps its
    complete result objects (those carrying "actual_iterations", written last in a row)."""
    cut, dropped = False, 0
    if isinstance(obj_or_text, (str, bytes)):
        text = obj_or_text.decode("utf-8", "replace") if isinstance(obj_or_text, bytes) else obj_or_text
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            (obj, dropped), cut = _json_prefix(text, source), True
    else:
        obj = obj_or_text
    if not isinstance(obj, dict) or not isinstance(obj.get("version"), int) or not (
            {"config", "results", "nccl_version"} & obj.keys()):
        raise HarnessError(f"{source}: not nccl-tests output: a JSON document without nccl-tests' "
                           "'version' and 'config'/'results' keys")
    args = [str(a) for a in obj.get("args") or []]
    names = {m.group(1) for m in BINARY_NAME.finditer(os.path.basename(args[0]))} if args else set()
    out = ParsedOutput(source, "", "json", [], False, args=args, num_dropped_rows=dropped)
    results = obj.get("results", [])
    if not isinstance(results, list):
        raise HarnessError(f"{source}: 'results' is not a list")
    for i, r in enumerate(results):
        what = f"{source}: results[{i}]"
        if not isinstance(r, dict) or "actual_iterations" not in r:
            out.num_dropped_rows += 1  # cut short: finalize closed it, or the file ends in it
            continue
        try:
            root = int(str(r.get("root", "-1")).strip())
            row = Row(int(r["size"]), int(r["count"]), str(r["type"]), str(r["redop"]), root,
                      _placement(r.get("out_of_place"), f"{what}.out_of_place"),
                      _placement(r.get("in_place"), f"{what}.in_place"))
        except (KeyError, TypeError, ValueError) as exc:
            raise HarnessError(f"{what}: not an nccl-tests result: {exc!r}") from None
        out.rows.append(row)
    avg = obj.get("average_bus_bandwidth")
    if isinstance(avg, dict):
        out.avg_busbw_gbps = _finite(avg.get("bandwidth"), f"{source}: average_bus_bandwidth")
        out.avg_busbw_failed = avg.get("okay") == "false"
    oob = obj.get("out_of_bounds")
    out.out_of_bounds = int(oob["count"]) if isinstance(oob, dict) and "count" in oob else None
    out.complete = not cut and isinstance(avg, dict) and out.num_dropped_rows == 0
    cfg = obj.get("config") if isinstance(obj.get("config"), dict) else {}
    devs = [d for d in cfg.get("devices", []) if isinstance(d, dict)]
    out.devices = [str(d.get("device_info")) for d in devs]
    out.hosts = sorted({str(d.get("hostname")) for d in devs})
    if {"nthreads", "ngpus"} <= cfg.keys():
        out.run_config = RunConfig(cfg["nthreads"], cfg["ngpus"], cfg.get("minimum_bytes", 0),
                                   cfg.get("maximum_bytes", 0), cfg.get("step_factor"), cfg.get("step_bytes"),
                                   cfg.get("warmup_iters", 0), cfg.get("iterations", 0),
                                   cfg.get("aggregated_iterations"), cfg.get("validation", 0), cfg.get("graph"))
        if devs:  # one device entry per process (util.cu parses the first Rank line of each)
            procs = sum(1 for d in devs if d.get("group") == devs[0].get("group"))
            out.num_ranks = cfg["nthreads"] * cfg["ngpus"] * procs
    if isinstance(obj.get("nccl_version"), int):
        out.nccl_version = _nccl_version_of(obj["nccl_version"])
    out.op, out.op_inferred = resolve_op(names, op, source, out.rows, out.num_ranks, json=True)
    env = [str(e).partition("=") for e in obj.get("env") or []]
    out.env = {k: v for k, _, v in env if k.startswith(ENV_PREFIXES)}
    out.failures = [str(e) for e in obj.get("errors") or [] if e]
    try:
        t0, t1 = (datetime.strptime(obj[k], "%Y-%m-%d %H:%M:%S") for k in ("start_time", "end_time"))
        out.wall_s = max(0.0, (t1 - t0).total_seconds())
    except (KeyError, TypeError, ValueError):
        pass
    return out


def parse_file(path: Union[str, Path], op: Optional[str] = None) -> ParsedOutput:
    """A saved nccl-tests output: JSON (-J) when it starts with '{', else text."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise HarnessError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if text.lstrip().startswith("{"):
        return parse_json(text, str(path), op)
    return parse_text(text, str(path), op)
