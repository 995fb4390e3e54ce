"""Reference tables (reference_results/*.json): what each platform should deliver, with provenance.

A reference file is a JSON object {"schema_version", "references": [entry, ...]}; an entry is
keyed by platform, benchmark, configuration and metric, and carries its value with unit,
direction (higher or lower is better), tolerance, samples and provenance (source, submitter,
date, system, environment fingerprint, suite commit, and the config fields the source does not
state but that were inferred, each with its evidence). A published OOM cell is an entry with
status "oom" and value null. The JSON Schema is schemas/reference.schema.json.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import jsonschema

from contract.collectives import NCCL_TYPES
from contract.metrics import reference_metrics, unit_of

from ..config.choices import Precision
from ..config.compose import compose
from ..config.schema import REPO_ROOT, TEACHER_SHAPE_FIELDS, ZeroConfig, grad_accum_precision, to_dict
from ..errors import HarnessError
from ..probe import pooled
from ..record import ResultRecord
from .by_size import PER_SIZE, as_stored, sizeless
from .compiled import cold
from .cross_machine import machine_name

REFERENCE_DIR = REPO_ROOT / "reference_results"
SCHEMA_PATH = REPO_ROOT / "schemas" / "reference.schema.json"
SCHEMA_VERSION = "1.0"
ZERO_DEFAULTS = {k: v for k, v in to_dict(ZeroConfig(stage=0)).items() if k != "stage"}
"""zero.* knobs at their schema defaults (None: DeepSpeed's; gradient_collective: all_reduce)."""


@dataclass(frozen=True)
class Provenance:
    source: str
    """Where the figure comes from: a publication, or 'suite' for records of this suite."""
    submitter: str
    date: str
    """ISO date the figure was published or submitted."""
    system: str
    """The system as described by the source."""
    environment: Optional[dict[str, Any]] = None
    """Environment fingerprint of the run (records' `environment`); None for published figures."""
    suite_commit: Optional[str] = None
    """The suite that made the figure: a commit, or 'content:sha256:<16 hex>' (a copy of the suite outside its
    git checkout, harness/provenance.py suite_identity); None for published figures."""
    note: Optional[str] = None
    """Anything the source leaves open (e.g. units it does not state)."""
    inferred: Optional[dict[str, str]] = None
    """Config fields the source does not state but that were inferred (e.g. from its own figures),
    each with its evidence: {field: evidence}. None when every config field is as published."""
    suite_commit_given: Optional[dict[str, Optional[str]]] = None
    """{"recorded": the records' suite_commit, "why": ...} when the submitter gave the commit instead
    (`submit --suite-commit SHA --why TEXT`: the records named a wrong one); suite_commit and
    environment["suite_commit"] then hold the commit given. None when both are the records' own."""


@dataclass(frozen=True)
class Reference:
    platform: str
    benchmark: str
    config: dict[str, Any]
    """What identifies the configuration: nodes, zero_stage, micro_batch_size, grad_acc_steps, ..."""
    metric: str
    value: Optional[float]
    """None when status is not ok (e.g. a published OOM cell)."""
    unit: str
    direction: str
    """'higher' or 'lower' is better."""
    tolerance_pct: float
    status: str = "ok"
    samples: tuple[float, ...] = field(default_factory=tuple)
    provenance: Optional[Provenance] = None
    by_size: tuple[dict[str, float], ...] = ()
    """A by-size reference's runs, one per sample: {size in bytes: busbw} of shared_busbw_gbps, {size: time in us}
    of shared_small_time_us (the sizes up to 64 KiB), what harness/verdict/by_size.py narrows to the sizes a run
    shares with it. Empty for every other metric (and absent from its file entry)."""

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    def key(self) -> tuple:
        return (self.platform, self.benchmark, json.dumps(self.config, sort_keys=True), self.metric)

    def machine(self) -> str:
        """The machine it was measured on, in cross_machine.machine_name's words ('AMD EPYC (2 CPUs, AVX2)',
        'H100 80GB HBM3'; the platform's name where its fingerprint does not say): a platform's boxes of two
        kinds (the same CPU name with and without AVX-512) each keep their own reference of a key."""
        return machine_name(self.provenance.environment if self.provenance else None, self.platform)

    def identity(self) -> tuple:
        """What a reference file holds once: the key on one machine."""
        return (*self.key(), self.machine())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = list(self.samples)
        d["num_samples"] = self.num_samples
        if self.by_size:
            d["by_size"] = [dict(sizes) for sizes in self.by_size]
        else:   # files written before the field stay as they were
            del d["by_size"]
        for optional in ("inferred", "suite_commit_given"):   # files written before the fields stay as they were
            if d["provenance"] is not None and d["provenance"][optional] is None:
                del d["provenance"][optional]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Reference":
        d = {k: v for k, v in d.items() if k != "num_samples"}
        return cls(**{**d, "samples": tuple(d.get("samples", ())), "by_size": tuple(d.get("by_size", ())),
                      "provenance": Provenance(**d["provenance"]) if d.get("provenance") else None})


@lru_cache(maxsize=1)
def _validator():
    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def validate_reference_file(data: Any) -> list[str]:
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(e.absolute_path))
    problems = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]
    if problems:
        return problems
    for i, entry in enumerate(data["references"]):
        if entry["num_samples"] != len(entry["samples"]):
            problems.append(f"references/{i}: num_samples={entry['num_samples']} but {len(entry['samples'])} samples")
        if "by_size" in entry and len(entry["by_size"]) != len(entry["samples"]):
            problems.append(f"references/{i}: {len(entry['by_size'])} runs in by_size but {len(entry['samples'])} samples")
        unknown = sorted(set(entry["provenance"].get("inferred") or {}) - set(entry["config"]))
        if unknown:
            problems.append(f"references/{i}: provenance.inferred names {unknown}, which the config does not have")
    seen: dict[tuple, int] = {}
    for i, entry in enumerate(data["references"]):
        key = Reference.from_dict(entry).identity()
        if key in seen:
            problems.append(f"references/{i}: same platform, benchmark, config, metric and machine as "
                            f"references/{seen[key]}")
        seen[key] = i
    return problems


class ReferenceFileError(HarnessError):
    """A reference file that does not parse (not readable, not JSON, not the schema), named with its problems."""

    def __init__(self, path: Path, problem: str, details: tuple[str, ...] = ()):
        self.path, self.problem, self.details = Path(path), problem, details
        super().__init__(f"{path}: {problem}" + (":\n  " + "\n  ".join(details) if details else ""))

    def line(self) -> str:
        """The file and its problem in one line: the first detail, and how many more."""
        more = f" (and {len(self.details) - 1} more)" if len(self.details) > 1 else ""
        return f"{self.path}: {self.problem}" + (f": {self.details[0]}{more}" if self.details else "")


@dataclass(frozen=True)
class ReferenceTables:
    """What the reference files hold: every reference of the files that parse, and those that do not."""
    references: list[Reference]
    unreadable: list[ReferenceFileError]
    """Files left out, each with its problem (`line()` says it in one line)."""


def load_file(path: Path) -> list[Reference]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, bytes that are not UTF-8
        raise ReferenceFileError(path, f"not a readable reference file: {exc}") from None
    problems = validate_reference_file(data)
    if problems:
        raise ReferenceFileError(path, "invalid reference file", tuple(problems))
    return [Reference.from_dict(e) for e in data["references"]]


def _files(paths: Optional[list[Path]]) -> list[Path]:
    return sorted(paths) if paths is not None else sorted(REFERENCE_DIR.glob("*.json"))


def load_references(paths: Optional[list[Path]] = None) -> list[Reference]:
    """Every reference in the given files (default: all of reference_results/*.json); a file that
    does not parse stops it (ReferenceFileError, naming the file)."""
    refs: list[Reference] = []
    for path in _files(paths):
        refs.extend(load_file(path))
    return refs


def read_references(paths: Optional[list[Path]] = None) -> ReferenceTables:
    """Like load_references, but a file that does not parse is left out and named (for `bench`, whose
    runs are done by then: one bad table must not cost the verdicts of the others)."""
    refs: list[Reference] = []
    unreadable: list[ReferenceFileError] = []
    for path in _files(paths):
        try:
            refs.extend(load_file(path))
        except ReferenceFileError as exc:
            unreadable.append(exc)
    return ReferenceTables(refs, unreadable)


def select(refs: list[Reference], **criteria: Any) -> list[Reference]:
    """References whose fields (platform, benchmark, metric, status) and config entries match;
    config criteria are given as config={...} and must all be present with equal values."""
    config = criteria.pop("config", {})
    return [r for r in refs if all(getattr(r, k) == v for k, v in criteria.items())
            and all(r.config.get(k) == v for k, v in config.items())]


# What a training or collective record contributes to the reference table, with direction
# (contract/metrics.py; the tolerances are contract.metrics.tolerances_for).
REFERENCE_METRICS = {kind: reference_metrics(kind) for kind in ("training", "collective")}
METRIC_DIRECTIONS = {m: d for metrics in REFERENCE_METRICS.values() for m, d in metrics.items()}


def record_grad_accum(cfg: dict[str, Any]) -> str:
    """The dtype a record's gradients accumulated in. Records made before the field existed ran
    without data_types, so in the model's dtype (DeepSpeed's default)."""
    w = cfg["workload"]
    if "grad_accum_dtype" not in w:
        return w["precision"]
    return grad_accum_precision(Precision(w["precision"]), cfg["zero"]["stage"],
                                None if w["grad_accum_dtype"] is None else Precision(w["grad_accum_dtype"])).value


SHAPE_FIELDS = ("vocab_size", *TEACHER_SHAPE_FIELDS)
"""The workload fields that make its model: a record whose shape differs from its named workload's
(workload.num_layers=6 on llama-440m, say) is another model, never a repeat of the named one."""


@lru_cache(maxsize=None)
def _named_shape(workload: str) -> dict[str, Any]:
    """conf/workload/<workload>.yaml's shape as composed (a distillation workload takes its student's
    from its defaults); {} for a name that is no workload of conf/."""
    try:
        w = compose([f"workload={workload}"]).workload
    except HarnessError:
        return {}
    return {k: getattr(w, k) for k in SHAPE_FIELDS}


def shape_override(workload: dict[str, Any]) -> dict[str, Any]:
    """The shape fields of a record's workload that differ from conf/workload/<name>.yaml's."""
    named = _named_shape(str(workload.get("name")))
    return {k: workload[k] for k in SHAPE_FIELDS if k in named and k in workload and workload[k] != named[k]}


STACK_DEFAULTS = {"compile": "none", "compile_mode": "default", "kernels": "eager", "attention": "auto"}
"""The training stack's settings (harness/config/stack.py) at the eager stack the paper measured: a run
away from them is another configuration (a compiled run is never judged against an eager reference).
fp8_recipe joins the key with precision fp8 only."""
STACK_KEYS = (*STACK_DEFAULTS, "fp8_recipe")
SWEEP_KEYS = ("bind_ranks",)
"""A collective sweep's settings that join its key only where they took effect (collective.bind_ranks: the ranks'
CPUs recorded in environment.rank_cpus): a reference without one ran at the default, every reference made before
it, and judges no sweep away from it (compare.same_configuration)."""
NCCL_KEY = "nccl_env"
"""The key of a run's own NCCL variables (config `nccl_env`, over the platform's): it parts groups of
repeats, and never keeps a reference from judging a run (compare.same_configuration, compare._best)."""


def record_config(record: ResultRecord) -> dict[str, Any]:
    """The configuration key of a record: what a reference of it is matched on."""
    cfg = record.config
    if record.kind != "training" and "collective" not in cfg:   # imported from a saved nccl-tests output
        return imported_key(record)
    key: dict[str, Any] = {"nodes": cfg["platform"]["nodes"], "num_ranks": record.environment.get("num_ranks")}
    nccl = cfg.get("nccl_env") or {}
    if nccl:   # the run's own NCCL settings (tune step 1, a -m sweep): runs of two settings are never pooled
        key[NCCL_KEY] = {k: str(v) for k, v in sorted(nccl.items())}   # as repeats; compare.same_configuration
    if record.kind == "training":
        key.update(zero_stage=cfg["zero"]["stage"], micro_batch_size=cfg["workload"]["micro_batch_size"],
                   grad_acc_steps=cfg["workload"]["grad_acc_steps"], seq_len=cfg["workload"]["seq_len"],
                   precision=cfg["workload"]["precision"],
                   # records made before the field existed ran without checkpointing
                   activation_checkpointing=cfg["workload"].get("activation_checkpointing", False))
        for name, default in (("checkpoint_every_n_layers", 1), ("checkpoint_policy", "full")):
            if cfg["workload"].get(name, default) != default:   # only when it differs: older keys stay the same
                key[name] = cfg["workload"][name]
        for name, default in STACK_DEFAULTS.items():   # the stack: only away from eager, as older keys were
            if cfg["workload"].get(name, default) != default:
                key[name] = cfg["workload"][name]
        shape = shape_override(cfg["workload"])
        if shape:   # only when it differs: the named workload's keys stay the same
            key["shape"] = shape
        accum = record_grad_accum(cfg)
        if accum != cfg["workload"]["precision"]:   # only when it differs: older keys stay the same
            key["grad_accum_dtype"] = accum
        if cfg["workload"]["precision"] == "fp8":
            key["fp8_recipe"] = cfg["workload"].get("fp8_recipe", "tensorwise")
        # only knobs set away from their default: a record made before a knob existed still matches
        knobs = {k: v for k, v in cfg["zero"].items() if k != "stage" and v != ZERO_DEFAULTS.get(k)}
        if knobs:
            key["zero"] = knobs
        distill = cfg["workload"].get("distill")
        if distill:  # what changes a distillation run's cost; the checkpoint's values do not
            teacher = {k: v for k, v in distill["teacher"].items() if k != "checkpoint" and v is not None}
            key["distill"] = {"alpha": distill["alpha"], "temperature": distill["temperature"], "teacher": teacher}
    else:
        c = cfg["collective"]
        key.update(min_bytes=c["min_bytes"], max_bytes=c["max_bytes"], dtype=c["dtype"], redop=c["redop"],
                   source=record.source)
        if c.get("bind_ranks") and record.environment.get("rank_cpus"):
            # only where the ranks were bound (asked, on cpu, with a CPU for each): an unbound sweep's key (every one
            # made before it, a GPU's, one on fewer CPUs than ranks) stays the same
            key["bind_ranks"] = True
    return key


OUR_DTYPES = {nccl: ours for ours, nccl in NCCL_TYPES.items() if ours != nccl}
"""nccl-tests' type names -> the suite's (`float` -> `float32`); a name both use is the same."""
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


def imported_key(record: ResultRecord) -> dict[str, Any]:
    """The key of a collective record `import-nccl-tests` made from a saved output, whose config is what
    the output says (no platform or collective group), in the terms of a sweep's (`collective.*`), so
    that it pairs with the same sweep run by `bench`: the nodes its ranks ran on, its ranks, nccl-tests'
    -b/-e (else its rows' sizes), its rows' type and reduction (an op that reduces nothing prints
    `none`: the sweep's default `sum` stands, as a sweep's key has it), and the source (a `-J` JSON output is
    `nccl-tests` there: the same binary's measurement as the text `bench collective.source=nccl-tests` parses)."""
    cfg, env = record.config, record.environment
    rows = [r for r in (record.rows or []) if isinstance(r, dict)]
    sizes = [r["size_bytes"] for r in rows if isinstance(r.get("size_bytes"), int)]
    args = cfg.get("nccl_tests") or {}
    dtype = next((r.get("dtype") for r in rows if r.get("dtype")), None)
    redop = next((r.get("redop") for r in rows if r.get("redop") not in (None, "none")), None)
    hosts = env.get("hosts") or []
    # the nodes only when every rank's line was there: a pasted tail names one host of a 72-rank run
    whole = cfg.get("num_ranks") and cfg.get("num_ranks_from", "rank lines") in ("rank lines", "json")
    return {"nodes": len(set(hosts)) if hosts and whole else None,
            "num_ranks": env.get("num_ranks") or cfg.get("num_ranks"),
            "min_bytes": args.get("min_bytes", min(sizes, default=None)),
            "max_bytes": args.get("max_bytes", max(sizes, default=None)),
            "dtype": OUR_DTYPES.get(dtype, dtype), "redop": redop or ("sum" if record.benchmark not in REDUCING else None),
            "source": "nccl-tests" if record.source == "nccl-tests-json" else record.source}   # -J: the same binary


def references_from_records(records: list[ResultRecord], *, source: str, submitter: str, date: str,
                            system: str, tolerance_pct: dict[str, float]) -> list[Reference]:
    """One reference per (platform, benchmark, configuration, metric) over repeated ok records:
    the median as value, every run's value as samples, the first run's fingerprint and commit."""
    groups: dict[tuple, list[ResultRecord]] = {}
    for rec in records:
        if rec.status != "ok":
            continue
        key = (rec.platform, rec.benchmark, json.dumps(record_config(rec), sort_keys=True), rec.kind)
        groups.setdefault(key, []).append(rec)
    def made(platform: str, benchmark: str, config: dict[str, Any], metric: str, recs: list[ResultRecord],
             samples: tuple[float, ...], unit: str, by_size: tuple[dict[str, float], ...] = ()) -> Reference:
        env = pooled(recs[0].environment, [r.environment for r in recs])   # the runs' probes, pooled
        return Reference(
            platform=platform, benchmark=benchmark, config=config, metric=metric, value=statistics.median(samples),
            unit=unit, direction=METRIC_DIRECTIONS[metric],
            tolerance_pct=tolerance_pct.get(metric, tolerance_pct["default"]), samples=samples, by_size=by_size,
            provenance=Provenance(source=source, submitter=submitter, date=date, system=system, environment=env,
                                  suite_commit=env.get("suite_commit"),
                                  note=f"median of {len(samples)} runs; runs: " + ", ".join(r.run_id for r in recs)))

    refs = []
    for (platform, benchmark, config, kind), recs in sorted(groups.items()):
        for metric in REFERENCE_METRICS[kind]:
            samples = tuple(r.metrics[metric]["value"] for r in recs if metric in r.metrics   # compile time: of cold
                            and (metric != "compile_s" or cold(r.environment)))              # compiles alone
            if samples:
                refs.append(made(platform, benchmark, json.loads(config), metric, recs, samples,
                                 recs[0].metrics[metric]["unit"]))
    shared: dict[tuple, list[tuple[ResultRecord, dict[int, float]]]] = {}   # by size: runs of every range pooled
    for metric, (of, _, _) in PER_SIZE.items():
        for (platform, benchmark, config, kind), recs in groups.items():
            for rec in recs:
                sizes = of(rec) if kind == "collective" else {}
                if sizes:
                    key = (platform, benchmark, json.dumps(sizeless(json.loads(config)), sort_keys=True), metric)
                    shared.setdefault(key, []).append((rec, sizes))
    for (platform, benchmark, config, metric), runs in sorted(shared.items()):
        refs.append(made(platform, benchmark, json.loads(config), metric, [r for r, _ in runs],
                         tuple(sum(d.values()) / len(d) for _, d in runs), unit_of(metric),
                         tuple(as_stored(d) for _, d in runs)))
    return refs
