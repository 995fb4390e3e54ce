"""nccl-tests (github.com/NVIDIA/nccl-tests): build its command line, find its binaries, turn its
output (parsed by harness.nccl_tests.output) into records, import saved outputs. No torch.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from contract.collectives import OPS
from contract.fingerprint import IMPORTED_FIELDS, OUTPUT_MACHINE, build
from contract.metrics import measured

from ..collectives import SMOKE_REASON, Placement, Row, avg_busbw_gbps
from ..config.schema import REPO_ROOT, BenchConfig
from ..errors import HarnessError
from ..launch.local import LaunchResult
from .cycles import split_cycles
from .infer import RATIO
from .json_format import parse_file
from .output import ParsedOutput
from ..plan import RunSpec
from ..record import ResultRecord, collective_record, environment, status_of, validate_record, write_record
from ..verdict.record_files import load_record

# --- records ----------------------------------------------------------------------------------

def _status(p: ParsedOutput, cycle: Optional[tuple[int, int]] = None) -> tuple[str, Optional[str]]:
    reasons = []
    if not p.complete:
        why = (f"cycle {cycle[0]} of {cycle[1]} cut short after {len(p.rows)} complete rows" if cycle
               else f"output cut short after {len(p.rows)} complete rows")
        if p.num_dropped_rows:
            why += f" ({p.num_dropped_rows} incomplete dropped)"
        why += f": {p.failures[0]}" if p.failures else ""
        if p.avg_busbw_gbps is None and p.rows and not cycle:
            why += ("; no \"Avg bus bandwidth\" footer: avg_busbw_gbps is the mean busbw of those rows "
                    "as printed")
        reasons.append(why)
    elif not p.rows:
        reasons.append("the output has no result rows")
    wrong = [(r.size_bytes, w) for r in p.rows for pl in (r.out_of_place, r.in_place)
             if pl is not None and (w := pl.num_wrong)]
    if wrong:
        reasons.append(f"{len(wrong)} placements with wrong values (#wrong > 0), first {wrong[0][1]} "
                       f"at {wrong[0][0]} B")
    if p.out_of_bounds:
        reasons.append(f"nccl-tests reports Out of bounds values: {p.out_of_bounds} FAILED")
    if p.avg_busbw_failed:
        reasons.append(f"Avg bus bandwidth {p.avg_busbw_gbps} FAILED (below NCCL_TESTS_MIN_BW)")
    return ("error", "; ".join(reasons)) if reasons else ("ok", None)


def records_from_output(parsed: ParsedOutput, *, run_id: str, platform: str, source_file: str,
                        cycle: Optional[tuple[int, int]] = None) -> ResultRecord:
    """One collective record (harness.record.collective_record) of a parsed output, or of one of its run
    cycles (`cycle`: (i, k), the i-th of k: harness/nccl_tests/cycles.py)."""
    status, reason = _status(parsed, cycle)
    models = sorted(set(parsed.devices))
    # what the output cannot say (python, torch, the driver, the image, the suite commit) stays None
    env = build(IMPORTED_FIELDS, cuda=parsed.cuda_version, nccl=parsed.nccl_version,
                gpu_model=" + ".join(models) or None, machine=machine_of_output(parsed),
                gpu_count=parsed.num_ranks or (len(parsed.devices) if parsed.layout != "json" else 0),
                env=dict(parsed.env), hosts=list(parsed.hosts), nccl_tests=parsed.nccl_tests_version,
                num_ranks=parsed.num_ranks)
    config = {"op": parsed.op, "op_inferred": parsed.op_inferred, "source_file": source_file,
              "layout": parsed.layout, "num_ranks": parsed.num_ranks, "num_ranks_from": parsed.ranks_from,
              "args": parsed.args,
              "nccl_tests": asdict(parsed.run_config) if parsed.run_config else None,
              "printed_avg_busbw_gbps": parsed.avg_busbw_gbps, "out_of_bounds": parsed.out_of_bounds,
              "num_dropped_rows": parsed.num_dropped_rows, "failures": parsed.failures,
              "error_values": [asdict(e) for e in parsed.errors]}
    if cycle:   # not in the record's key (references.imported_key): the cycles are runs of one configuration
        config["run_cycle"] = {"cycle": cycle[0], "of": cycle[1]}
    smoke = parsed.num_ranks == 1   # one GPU: nccl-tests prints busbw 0 (all_reduce) or algbw; no bus exists
    rows = [r if not smoke else Row(r.size_bytes, r.count, r.dtype, r.redop, r.root,
                                    *(None if pl is None else Placement.smoke(pl.time_us, pl.num_wrong)
                                      for pl in (r.out_of_place, r.in_place)))
            for r in parsed.rows]
    record = collective_record(
        run_id=run_id, name=f"{parsed.op} ({Path(source_file).name})", benchmark=parsed.op,
        platform=platform, status=status, reason=reason, rows=[r.to_dict() for r in rows],
        config=config, overrides=[], environment=env, complete=parsed.complete,
        source="nccl-tests-json" if parsed.layout == "json" else "nccl-tests", wall_s=parsed.wall_s or 0.0,
        smoke_reason=SMOKE_REASON if smoke else None)
    if record.metrics:  # nccl-tests' own figure (unrounded busbw); the printed rows' mean only without it
        printed = parsed.avg_busbw_gbps is not None and not cycle   # a cycle's: its rows' (the footer's is all)
        record.metrics["avg_busbw_gbps"] = measured(
            "avg_busbw_gbps", parsed.avg_busbw_gbps if printed else avg_busbw_gbps(rows), "throughput", n=len(rows),
            source="nccl-tests footer" if printed else
            f"mean of this cycle's printed rows (the footer averages all {cycle[1]} cycles)" if cycle else
            "mean of the printed rows (no footer)")
    return record


def machine_of_output(parsed: ParsedOutput) -> Optional[dict[str, Any]]:
    """A node's machine as the output names it, in the fingerprint's terms (benchmarks/node/machine.py: `gpus`
    by name; the CPU unknown): one GPU model, the ranks spread evenly over the hosts, and every rank's Rank
    line there (a -J JSON output: each process's first device, its other GPUs taken as of the same model);
    None otherwise (a pasted tail, mixed GPUs)."""
    models = set(parsed.devices)
    whole = (parsed.ranks_from == "rank lines" and len(parsed.devices) == parsed.num_ranks) or parsed.ranks_from == "json"
    if not whole or len(models) != 1 or not parsed.hosts or not parsed.num_ranks or parsed.num_ranks % len(parsed.hosts):
        return None
    return {"cpu": {}, "gpus": [{"name": next(iter(models))}] * (parsed.num_ranks // len(parsed.hosts)),
            "source": OUTPUT_MACHINE}


def _run_id(path: str) -> str:
    return "nccl-tests-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(path).stem).strip("-.") or "output")


def import_files(paths: list[str], out_dir: Path, platform: str = "unknown",
                 op: Optional[str] = None) -> list[Path]:
    """Parse every file, then write one record per file (run id nccl-tests-<file stem>) into out_dir, one per
    run cycle of an output of several (`-N k`: nccl-tests-<stem>-cycle1 .. k, harness/nccl_tests/cycles.py).
    Nothing is written when any file is bad or any record file already exists."""
    if not paths:
        raise HarnessError("import-nccl-tests needs files: nccl-tests stdout or -J JSON")
    if not platform:
        raise HarnessError("platform='' is invalid; give a platform name (e.g. h100)")
    parsed, bad = [], []
    for path in paths:
        try:
            parsed.append((str(path), parse_file(path, op)))
        except HarnessError as exc:
            bad.append(str(exc))
    if bad:
        raise HarnessError(f"{len(bad)} of {len(paths)} files cannot be imported (nothing written):\n  "
                           + "\n  ".join(bad))
    parts = []   # (file, one run cycle's output, (i, k) of k cycles, None for an output of one)
    for path, p in parsed:
        cycles = split_cycles(p)
        parts += [(path, part, (i + 1, len(cycles)) if len(cycles) > 1 else None) for i, part in enumerate(cycles)]
    ids = [_run_id(path) + (f"-cycle{cycle[0]}" if cycle else "") for path, _, cycle in parts]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise HarnessError(f"files would share the record ids {', '.join(dupes)}; rename them (nothing written)")
    out_dir = Path(out_dir)
    existing = [str(out_dir / f"{i}.json") for i in ids if (out_dir / f"{i}.json").exists()]
    if existing:
        raise HarnessError(f"refusing to overwrite existing records (nothing written): {', '.join(existing)}")
    records = [records_from_output(p, run_id=i, platform=platform, source_file=path, cycle=cycle)
               for (path, p, cycle), i in zip(parts, ids)]
    for rec in records:
        problems = validate_record(rec.to_dict())
        if problems:
            raise HarnessError(f"record {rec.run_id} does not match the schema (nothing written): "
                               + "; ".join(problems))
    return [write_record(rec, out_dir) for rec in records]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad argument is a HarnessError (exit 2 via harness.__main__)
        raise HarnessError(f"{self.prog}: {message}")


def cli(args: list[str]) -> int:
    """python -m harness import-nccl-tests FILE... [--out DIR] [--platform NAME] [--op OP].
    Exit 0 when every record is ok, 3 when one records an error (cut short, wrong values)."""
    parser = _Parser(prog="python -m harness import-nccl-tests",
                     description="Import nccl-tests outputs (stdout or -J JSON) as collective records.")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--out", type=Path, help="record folder (default results/<timestamp>-nccl-tests)")
    parser.add_argument("--platform", default="unknown", help="platform name stored in each record")
    parser.add_argument("--op", choices=OPS, help="the collective, when the output does not name its binary")
    ns = parser.parse_args(args)
    out = ns.out or REPO_ROOT / "results" / f"{datetime.now():%Y%m%d-%H%M%S}-nccl-tests"
    worst = 0
    for path in import_files(ns.files, out, ns.platform, ns.op):
        rec = load_record(path)
        worst = max(worst, 0 if rec.status == "ok" else 3)
        inferred = rec.config.get("op_inferred")
        cycle = rec.config.get("run_cycle")
        print(f"{path}: {rec.benchmark}, {len(rec.rows or [])} rows"
              + (f" (run cycle {cycle['cycle']} of {cycle['of']})" if cycle else "") + f", {rec.status}"
              + (f" ({rec.reason})" if rec.reason else "")
              + (f"; op {rec.benchmark} {inferred}" if inferred else "")
              + (f"; {rec.config['num_ranks']} ranks read from busbw/algbw (the Rank lines are cut short: the "
                 "nodes are not known)" if rec.config.get("num_ranks_from") == RATIO else ""))
    return worst


def nccl_tests_record(run: RunSpec, cfg: BenchConfig, launch: LaunchResult) -> ResultRecord:
    """The record of one nccl-tests binary run: its stdout parsed (complete rows only); the
    launch's own failure (timeout, crash) comes first in status and reason."""
    log = run.run_dir / "rank0.log"
    op = run.spec.ops[0]
    launch_status, launch_reason = status_of(run, launch, [], [], expect_run_stop=False)
    try:
        record = records_from_output(parse_file(log, op), run_id=run.run_id, platform=cfg.platform.name,
                                     source_file=str(log))
    except HarnessError as exc:
        record = collective_record(run_id=run.run_id, name=run.name, benchmark=op, platform=cfg.platform.name,
                                   status="error", reason=str(exc), rows=[], config=run.config,
                                   overrides=run.overrides, environment=environment(run, cfg, [], [], launch),
                                   complete=False, source="nccl-tests")
    if launch_status != "ok":
        record.status = launch_status
        record.reason = launch_reason + (f"; {record.reason}" if record.reason else "")
    controller = environment(run, cfg, [], [], launch)
    record.environment = {**controller, **{k: v for k, v in record.environment.items() if v is not None}}
    record.name, record.config, record.overrides, record.wall_s = run.name, run.config, run.overrides, launch.wall_s
    return record
