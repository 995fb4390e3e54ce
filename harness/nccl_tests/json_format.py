"""nccl-tests' -J JSON output (src/util.cu, JSON_FILE_VERSION 1 and 2, layout "json") parsed into the
same rows as its text (harness/nccl_tests/output.py), and parse_file, which reads a saved output of
either format. I/O only in parse_file; no torch."""
from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Optional, Union

from contract.fingerprint import ENV_PREFIXES

from ..collectives import Placement, Row
from ..errors import HarnessError
from .infer import BINARY_NAME, resolve_op
from .output import ParsedOutput, RunConfig, finite_number, nccl_version_of, parse_text

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
    vals = [finite_number(obj.get(k), f"{what}.{k}") for k in (time_key, "alg_bw", "bus_bw")]
    wrong = obj.get("nwrong")
    return Placement(*vals, None if wrong is None else int(round(finite_number(wrong, f"{what}.nwrong"))))


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
        out.avg_busbw_gbps = finite_number(avg.get("bandwidth"), f"{source}: average_bus_bandwidth")
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
        out.nccl_version = nccl_version_of(obj["nccl_version"])
    out.op, out.op_inferred = resolve_op(names, op, source, out.rows, out.num_ranks, json=True)
    out.ranks_from = "json" if out.num_ranks else None
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
