"""Result records: a run's events + environment + resolved config + status -> one JSON file.

Field names are the suite's public interface (schemas/record.schema.json). Records are checked
against the schema and written atomically (temp file + rename).
"""
from __future__ import annotations

import copy
import json
import platform as py_platform
import signal
import socket
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

import jsonschema

from benchmarks.training.arrivals import into_steps
from contract import events as ev
from contract.metrics import measured
from contract.fingerprint import (CONTROLLER_FIELDS, DEEPSPEED_JSON, DIGEST_VAR, IMAGE_VAR, build, flat_json, recorded_env,
                                  stack_versions)

from .atomic import write_bytes_atomic
from .collectives import (PER_CALL, SMALL_BYTES, SMOKE_REASON, Placement, Row, avg_busbw_gbps, large_busbw_gbps,
                          large_rows, small_median_us, small_p25_us, small_stalled_pct, small_time_us)
from .config.schema import REPO_ROOT, BenchConfig
from .errors import HarnessError
from .hardware import hardware_mismatches
from .held_up import straggler
from .launch.local import LaunchResult
from .nodes import links, load_during, node_views
from .plan import RunSpec
from .probe import node_probes
from .provenance import suite_commit
from .stack_view import stack_metrics, stack_of
from .training_metrics import compute_metrics, finite

SCHEMA_VERSION = "1.2"
"""1.1: environment.machine.probe (and each node's), the capability probe; metrics.matmul_eff_pct. 1.2:
environment.triton, liger_kernel, torchao, environment.stack described, the compilers' variables in
environment.env. A 1.0 or 1.1 record stays valid."""
NOT_RECORDS = ("suite.json", "gpu-check.json", "tune.json")
"""JSON files a results folder holds beside its records (the suite's index, gpu-check's summary, tune's state)."""
SCHEMA_PATH = REPO_ROOT / "schemas" / "record.schema.json"


@dataclass
class ResultRecord:
    schema_version: str
    run_id: str
    kind: str
    benchmark: str
    platform: str
    status: str
    reason: Optional[str]
    config: dict[str, Any]
    overrides: list[str]
    environment: dict[str, Any]
    metrics: dict[str, dict[str, Any]]
    microsteps: list[list[dict[str, Any]]]
    name: str = ""
    created_utc: str = ""
    flops: Optional[dict[str, Any]] = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    rows: Optional[list[dict[str, Any]]] = None
    """kind 'collective': nccl-tests rows (harness.collectives.Row)."""
    complete: Optional[bool] = None
    """kind 'collective': False when the output was cut short (only complete rows are kept)."""
    source: Optional[str] = None
    """kind 'collective': 'builtin' (torch.distributed sweep), 'nccl-tests' or 'nccl-tests-json'."""
    plot: Optional[str] = None
    """kind 'collective': the busbw PNG beside the records, if one was drawn."""
    smoke: Optional[dict[str, Any]] = None
    """kind 'collective', a one-rank built-in sweep: {"reason": ..., "rows": [...]}: every op run
    through the backend and checked, rows without bandwidth (algbw/busbw null); such a record has
    no `rows` and no avg_busbw_gbps, so nothing reads it as a bandwidth figure."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "record") -> "ResultRecord":
        """A record read back: `data` must match schemas/record.schema.json (HarnessError naming
        `where` and every violation otherwise); the dict is copied, never kept."""
        problems = validate_record(data)
        if problems:
            raise HarnessError(f"{where}: not a valid record ({SCHEMA_PATH.name}): " + "; ".join(problems[:5])
                               + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
        known = {f.name for f in fields(cls)}
        return cls(**{k: copy.deepcopy(v) for k, v in data.items() if k in known})


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def controller_environment() -> dict[str, Any]:
    """What the controller knows without importing torch (the packages' versions from their metadata);
    ranks' own view overrides it."""
    return build(CONTROLLER_FIELDS, python=py_platform.python_version(), torch=_version("torch"),
                 deepspeed=_version("deepspeed"), transformers=_version("transformers"),
                 datasets=_version("datasets"), **stack_versions(), gpu_count=0, env={}, host=socket.gethostname())


SETTINGS = ("measure.inject_delay_s", "measure.inject_delay_rank", "measure.inject_delay_node", "measure.warmup_steps",
            "measure.steps", "platform.launcher")
"""Settings outside a reference's configuration key that change what a run measures; the record
keeps them (environment.settings) so that a comparison can name them as what changed."""


def settings(cfg: BenchConfig) -> dict[str, Any]:
    out = {}
    for dotted in SETTINGS:
        value: Any = cfg
        for part in dotted.split("."):
            value = getattr(value, part)
        out[dotted] = getattr(value, "value", value)   # an Enum as its value
    return out


def environment(run: RunSpec, cfg: BenchConfig, events: list[dict], ranks: list[dict],
                launch: Optional[LaunchResult] = None) -> dict[str, Any]:
    env = controller_environment()
    seen = [e["value"] for e in events if e["key"] == ev.ENVIRONMENT]
    if seen:
        env.update(seen[0])
    else:  # the ranks never reported: what they were given is the best record
        env["env"] = recorded_env(run.env)
    if cfg.platform.container.runtime.value != "none":  # what the ranks were told, if they never said
        env["container_image"] = env.get("container_image") or run.env.get(IMAGE_VAR)
        env["container_digest"] = env.get("container_digest") or run.env.get(DIGEST_VAR)
        env["container_runtime"] = env.get("container_runtime") or cfg.platform.container.runtime.value
    if launch is not None and launch.job is not None:
        env["slurm"] = launch.job
    nodes = node_views(run.run_dir, seen[0] if seen else None)
    if nodes:  # every node's machine and link rates, as the first rank on it read them
        env["nodes"], env["links"] = nodes, links(nodes)
    env["hosts"] = sorted({r["host"] for r in ranks}) or [n["host"] for n in nodes] or [env["host"]]
    env["num_nodes"] = cfg.platform.nodes
    env["num_ranks"] = run.num_ranks
    env["suite_commit"] = suite_commit()
    env["settings"] = settings(cfg)
    loads = [e["value"] for e in events if e["key"] == ev.LOAD]
    before = ((env.get("machine") or {}).get("cpu") or {}).get("load_avg_1_5_15")
    env["load"] = load_during(loads[0] if loads else [], before)
    bound = sorted((w for w in (loads[0] if loads else []) if isinstance(w, dict) and w.get("cpus")),
                   key=lambda w: w.get("rank", 0))
    if bound:   # the CPUs each rank's threads were bound to (collective.bind_ranks), in rank order
        env["rank_cpus"] = {str(w.get("rank")): w["cpus"] for w in bound}
    env["controller_host"] = socket.gethostname()
    env["hardware_mismatch"] = hardware_mismatches(cfg.platform, env)
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def status_of(run: RunSpec, launch: LaunchResult, events: list[dict], failures: list[dict],
              expect_run_stop: bool = True) -> tuple[str, Optional[str]]:
    """Decide a run's status and reason from what the ranks said and how they exited.

    The root cause comes first: an out-of-memory anywhere, then a rank killed by a signal the
    launcher did not send (its peers then fail with "connection closed", a consequence), then
    what failing ranks reported, then bare exit codes. Peers' reports follow as context.
    """
    steps = sum(e["key"] == ev.TRAIN_STEP for e in events)
    if launch.timed_out and launch.cause:
        return "timeout", f"{launch.cause} (after {steps} optimizer steps)"
    if launch.timed_out:
        return "timeout", (f"exceeded measure.timeout_s={run.timeout_s:g} s after {steps} "
                           f"optimizer steps; ranks {launch.killed_ranks} killed")
    bad = {r: c for r, c in launch.exit_codes.items() if c not in (0, None)}
    signalled = {r: c for r, c in bad.items() if c < 0}
    ooms = [f for f in failures if f["status"] == "oom"]
    if ooms:
        status, cause = "oom", ooms[0]["reason"]
    elif launch.cause:   # no exit codes: no rank was started (an op it needs did not build)
        status, cause = launch.cause_status, launch.cause + (f" after {steps} optimizer steps" if launch.exit_codes else "")
    elif signalled:
        rank, code = min(signalled.items())
        status, cause = "error", f"rank {rank} killed by {_signal_name(code)} after {steps} optimizer steps"
    elif failures:
        status, cause = failures[0]["status"], failures[0]["reason"]
    elif bad:
        rank, code = min(bad.items())
        status, cause = "error", f"rank {rank} exited with code {code} after {steps} optimizer steps"
    elif launch.killed_ranks:
        status, cause = "error", f"ranks {launch.killed_ranks} were killed"
    elif expect_run_stop and not any(e["key"] == ev.RUN_STOP for e in events):
        return "error", "ranks exited 0 without a run_stop event"
    else:
        return "ok", None
    context = [f["reason"][:300] for f in failures if f["reason"] != cause]
    return status, cause + ("; then " + "; ".join(context) if context else "")


def _rank_failures(run_dir: Path, events: list[dict]) -> list[dict]:
    found = [e["value"] for e in events if e["key"] == ev.FAILURE]
    for path in sorted(run_dir.glob("events.rank*.jsonl")):
        found += [e["value"] for e in ev.read_events(path) if e["key"] == ev.FAILURE]
    return found


def build_record(run: RunSpec, cfg: BenchConfig, launch: LaunchResult) -> ResultRecord:
    events = ev.read_events(run.run_dir / ev.EVENTS_FILE)
    steps = [e["value"] for e in events if e["key"] == ev.TRAIN_STEP]
    for found in (e["value"] for e in events if e["key"] == ev.ARRIVALS):
        into_steps(steps, found)
    ranks = next((e["value"] for e in events if e["key"] == ev.RANK_SUMMARY), [])
    num_params = next((e["value"] for e in events if e["key"] == ev.NUM_PARAMS), None)
    teacher = next((e["value"] for e in events if e["key"] == ev.TEACHER), None)
    status, reason = status_of(run, launch, events, _rank_failures(run.run_dir, events))
    env = environment(run, cfg, events, ranks, launch)
    if env.get("load") and (late := straggler(steps)):   # the rank the others waited for most (held_up.py)
        env["load"]["straggler"] = late
    metrics, flops = (compute_metrics(cfg, steps, ranks, num_params, teacher, node_probes(env)) if status == "ok"
                      else ({}, None))
    env[DEEPSPEED_JSON] = flat_json(run.spec.deepspeed)   # what the ranks ran, a user's JSON merged in
    stack = next((e["value"] for e in events if e["key"] == ev.STACK), None)
    if stack:
        env["stack"] = stack_of(stack)
        if status == "ok":
            metrics.update(stack_metrics(stack, steps))
    return ResultRecord(
        schema_version=SCHEMA_VERSION, run_id=run.run_id, kind="training", benchmark=cfg.workload.name,
        platform=cfg.platform.name, status=status, reason=reason, config=run.config,
        overrides=run.overrides, environment=env, metrics=metrics,
        microsteps=[s["microsteps"] for s in steps if s["mode"] == "profile"], name=run.name,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), flops=flops,
        steps=[{"index": s["index"], "mode": s["mode"], "warmup": s["warmup"],
                "step_time_s": s["step_time_s"], "loss": finite(s["loss"]),
                **{k: s[k] for k in ("frames_compiled", "arrivals") if k in s},
                **{k: finite(s[k]) for k in ("ce_loss", "kl_loss") if k in s}} for s in steps],
        ranks=ranks, wall_s=launch.wall_s)


@lru_cache(maxsize=1)
def _validator():
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def validate_record(data: Any) -> list[str]:
    """Every schema violation, as 'path: message' lines (empty when valid)."""
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def write_json_atomic(path: Path, data: Any) -> None:
    """JSON (no NaN or infinity: they are not JSON) written atomically."""
    write_bytes_atomic(path, (json.dumps(data, indent=2, allow_nan=False) + "\n").encode("utf-8"))


def write_record(record: ResultRecord, out_dir: Path) -> Path:
    data = record.to_dict()
    problems = validate_record(data)
    if problems:
        raise HarnessError(f"record {record.run_id} does not match {SCHEMA_PATH.name}: " + "; ".join(problems))
    path = out_dir / f"{record.run_id}.json"
    write_json_atomic(path, data)
    return path


def collective_record(*, run_id: str, name: str, benchmark: str, platform: str, status: str,
                      reason: Optional[str], rows: list[dict[str, Any]], config: dict[str, Any],
                      overrides: list[str], environment: dict[str, Any], complete: bool = True,
                      source: str = "builtin", wall_s: float = 0.0,
                      smoke_reason: Optional[str] = None, one_host: bool = True) -> ResultRecord:
    """A record of kind 'collective': nccl-tests rows (harness.collectives.Row.to_dict()) and the
    avg_busbw_gbps metric. `complete` is False when the output was cut short (rows kept are only
    the complete ones; none is invented or repaired). With `smoke_reason` (a one-rank sweep) the
    rows, which carry no bandwidth, go under `smoke` and the record has no rows and no metric.
    small_median_us only where every rank ran on one host (`one_host`): across the emulated cluster's
    shaped links a small call's median is no steadier than its mean (docs/collectives.md); the rows keep
    each placement's median all the same. The lower quartile (small_p25_us) wherever the calls were timed one
    by one: there it is steady on one host and across the links alike."""
    smoke = None
    if smoke_reason is not None:
        smoke, rows, metrics = {"reason": smoke_reason, "rows": rows}, None, {}
    else:
        parsed = [Row.from_dict(r) for r in rows]
        metrics = {"avg_busbw_gbps": measured("avg_busbw_gbps", avg_busbw_gbps(parsed), "throughput",
                                            n=len(parsed))} if parsed else {}
        large = large_busbw_gbps(parsed)
        if large is not None:   # the largest sizes' busbw (contract/collectives.py LARGE_SPAN): the link's
            metrics["large_busbw_gbps"] = measured("large_busbw_gbps", large, "throughput", n=len(large_rows(parsed)))
        small = small_time_us(parsed)
        if small is not None:   # the latency-bound sizes' time (harness/collectives.py SMALL_BYTES)
            metrics["small_time_us"] = measured("small_time_us", small, "throughput",
                                                n=sum(1 for r in parsed if 0 < r.size_bytes <= SMALL_BYTES))
        median = small_median_us(parsed) if one_host else None
        if median is not None:   # the same sizes' median call, where each call was timed (the built-in sweep on cpu)
            metrics["small_median_us"] = measured("small_median_us", median, "throughput",
                                                  n=metrics["small_time_us"]["n"])
        quartile = small_p25_us(parsed)
        if quartile is not None:   # their lower quartile call, and the share of calls held up (information)
            metrics["small_p25_us"] = measured("small_p25_us", quartile, "throughput", n=metrics["small_time_us"]["n"])
            metrics["small_stalled_pct"] = measured("small_stalled_pct", small_stalled_pct(parsed), "throughput",
                                                    n=metrics["small_time_us"]["n"])
    return ResultRecord(
        schema_version=SCHEMA_VERSION, run_id=run_id, kind="collective", benchmark=benchmark,
        platform=platform, status=status, reason=reason, config=config, overrides=overrides,
        environment=environment, metrics=metrics, microsteps=[], name=name,
        created_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=wall_s,
        rows=rows, complete=complete, source=source, smoke=smoke)


def build_collective_records(run: RunSpec, cfg: BenchConfig, launch: LaunchResult) -> list[ResultRecord]:
    """One record per op of a built-in sweep (nccl-tests prints one table per op). On one rank the
    sweep is a smoke run: its records say so (`smoke`) and carry no bandwidth."""
    events = ev.read_events(run.run_dir / ev.EVENTS_FILE)
    status, reason = status_of(run, launch, events, _rank_failures(run.run_dir, events))
    env = environment(run, cfg, events, [], launch)
    by_op: dict[str, list[dict[str, Any]]] = {op: [] for op in run.spec.ops}
    smoke = run.num_ranks == 1
    for e in events:
        if e["key"] != ev.COLLECTIVE_ROW:
            continue
        v, n = e["value"], e["value"]["num_ranks"]
        measured = {k: Placement.smoke(v[k]["time_us"], v[k]["num_wrong"]) if smoke else
                    Placement.measured(v["op"], v["size_bytes"], v[k]["time_us"], n, v[k]["num_wrong"],
                                       **{f: v[k].get(f) for f in PER_CALL})
                    for k in ("out_of_place", "in_place") if v[k] is not None}
        by_op[v["op"]].append(Row(v["size_bytes"], v["count"], v["dtype"], v["redop"], v["root"],
                                  measured["out_of_place"], measured.get("in_place")).to_dict())
    records = []
    for record_id, (op, rows) in zip(run.record_ids(), by_op.items()):
        op_status, op_reason = status, reason
        complete = len(rows) == len(run.spec.sizes)
        wrong = [r["size_bytes"] for r in rows for k in ("out_of_place", "in_place")
                 if r[k] and r[k]["num_wrong"]]
        if op_status == "ok" and wrong:
            op_status, op_reason = "error", f"wrong results at sizes {sorted(set(wrong))} B"
        elif op_status == "ok" and not complete:
            op_status, op_reason = "error", f"{len(rows)} of {len(run.spec.sizes)} sizes measured"
        records.append(collective_record(
            run_id=record_id, name=f"{run.name} {op}", benchmark=op, platform=cfg.platform.name,
            status=op_status, reason=op_reason, rows=rows, config=run.config, overrides=run.overrides,
            environment=env, complete=complete, source="builtin", wall_s=launch.wall_s,
            smoke_reason=SMOKE_REASON if smoke else None, one_host=cfg.platform.nodes == 1))
    return records
