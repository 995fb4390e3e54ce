"""Submissions: result records -> reference_results/<platform>.json, with provenance.

`python -m harness submit RESULTS...` checks every record (schema, status ok, complete environment
fingerprint, units, finite and sane values, known platform, one platform, enough repeats per
configuration), and lists every problem at once; a rejected submission writes nothing. Accepted
records are aggregated (harness.verdict.references.references_from_records: the median, every run as a
sample) and merged into the platform's reference file under an exclusive lock, written atomically.
An existing reference (same platform, benchmark, config and metric, measured on the same machine) is replaced
only with --replace --reason; the old value, samples, source and date go into the new entry's note. Records of
another machine of the platform (cross_machine.machine_name: the same CPU name with AVX-512 where the table's
has AVX2 only) are added beside the table's, each machine's judging its own runs (compare.judge).
Records that name a wrong suite commit (a copy of the suite run inside another repository, made
before suite_identity knew it) are submitted with --suite-commit SHA --why TEXT: a commit of this
checkout's history, written into each entry's provenance with what the records said and why; the
records stay as they are.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import getpass
import json
import math
import re
import statistics
import subprocess
import sys
import warnings
from datetime import date as Date
from pathlib import Path
from typing import Any, Optional

from contract.fingerprint import REQUIRED, REQUIRED_CUDA
from contract.metrics import METRICS, tolerances_for

from .compare import machine_of
from ..config.schema import CONF_DIR, REPO_ROOT
from ..errors import HarnessError
from ..provenance import CONTENT_PREFIX, suite_identity
from ..record import ResultRecord, validate_record, write_json_atomic
from ..report.submitted import submitted_table
from . import imported
from .by_size import AVERAGE, BY_SIZE, sizeless
from .record_files import none_found, read_json, record_files
from .references import (REFERENCE_DIR, SCHEMA_VERSION, Reference, record_config, references_from_records,
                         validate_reference_file)

SOURCE = "suite submission"
LOCK_NAME = ".submit.lock"
# What a submission checks of each metric a reference is made of: its unit, and bounds outside which a
# value is a broken measurement, not a slow system (contract/metrics.py).
CHECKED = [(m.name, m.unit, m.bounds) for m in METRICS.values() if m.reference_kind and m.bounds]
# reference_results/README.md: suite figures 10% (peak memory 5%); the noisy shared cpu box 25/50/10%.


class SubmissionRejected(HarnessError):
    """Nothing was written; `reasons` lists every problem found."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("submission rejected:\n  " + "\n  ".join(reasons))


@dataclasses.dataclass(frozen=True)
class Change:
    action: str
    """'added', 'replaced' or 'pooled into' (a by-size reference's runs, harness/verdict/by_size.py)."""
    reference: Reference
    path: Path
    beside: tuple[str, ...] = ()
    """The other machines whose references of the same key the table keeps beside it."""


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def _nonfinite(value: Any, path: str) -> list[str]:
    """Paths of NaN/infinite numbers anywhere in value."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{path} = {value}"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nonfinite(v, f"{path}/{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _nonfinite(v, f"{path}/{i}")]
    return []


def read_records(paths: list[Path]) -> tuple[list[tuple[str, Any]], list[str]]:
    """(name, parsed JSON) of every record file (record_files: a folder's *.json but suite.json and
    the other files beside records), and every problem reading them: submit reports them all at once
    (check_records judges each record against the schema). NaN/Infinity tokens are parsed, to be refused."""
    files: list[Path] = []
    problems: list[str] = []
    for path in paths:
        try:
            files += [f for f, _ in record_files([path])]
        except HarnessError as exc:
            problems.append(str(exc))
    loaded = []
    for f in files:
        try:
            loaded.append((str(f), read_json(f)))
        except HarnessError as exc:
            problems.append(str(exc))
    if not files and not problems:
        problems.append(none_found(paths))
    return loaded, problems


def check_record(name: str, rec: Any) -> list[str]:
    """Every reason this one record cannot become a reference."""
    problems = [f"{name}: schema: {p}" for p in validate_record(rec)]
    if not isinstance(rec, dict):
        return problems
    if rec.get("status") != "ok":
        problems.append(f"{name}: status {rec.get('status')!r}: only status 'ok' records become references")
    if rec.get("kind") not in ("training", "collective"):
        problems.append(f"{name}: kind {rec.get('kind')!r}: only 'training' and 'collective' records are submitted")
    if rec.get("smoke"):
        problems.append(f"{name}: a smoke run ({_get(rec, 'smoke', 'reason')}): it measures no bandwidth, "
                        "so it cannot become a reference")
    platform = rec.get("platform")
    if not (isinstance(platform, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", platform)
            and (CONF_DIR / "platform" / f"{platform}.yaml").is_file()):
        problems.append(f"{name}: unknown platform {platform!r}: no conf/platform/<name>.yaml")
    env = rec.get("environment")
    if imported.is_imported(rec):   # a saved nccl-tests output: what it can say (harness/verdict/imported.py)
        return problems + imported.problems(name, rec) + _values(name, rec)
    required = REQUIRED + (REQUIRED_CUDA if _get(rec, "config", "platform", "device") == "cuda" else ())
    for key in required:
        value = _get(env, key)
        if not (isinstance(value, str) and value.strip()):
            problems.append(f"{name}: environment.{key} is {value!r}: the fingerprint needs it non-empty")
    if _get(rec, "config", "platform", "device") == "cuda":
        mismatch = _get(env, "hardware_mismatch")
        if mismatch is None:
            problems.append(f"{name}: environment.hardware_mismatch is missing: the platform's declared GPU was "
                            "never checked against the detected one")
        problems += [f"{name}: hardware: {m}; a record of other hardware than its platform declares cannot "
                     "become that platform's reference" for m in mismatch or []]
    if _get(rec, "kind") in ("training", "collective") and machine_of(env if isinstance(env, dict) else None) is None:
        problems.append(f"{name}: environment.machine does not name the hardware (CPU model, or the GPUs): a "
                        "reference is per machine, so it must record the one it was measured on")
    return problems + _values(name, rec)


def _values(name: str, rec: dict[str, Any]) -> list[str]:
    """What any record must be to become a reference: named hosts, finite values, metrics in their units and bounds."""
    problems = []
    hosts = _get(rec.get("environment"), "hosts")
    if not (isinstance(hosts, list) and hosts and all(isinstance(h, str) and h for h in hosts)):
        problems.append(f"{name}: environment.hosts is {hosts!r}: the fingerprint needs the host names")
    metrics = rec.get("metrics")
    # anywhere, not only in metrics: a record is JSON without NaN/infinity, and whatever it carries
    # (its environment goes into the reference's provenance) must be writable as such
    problems += [f"{name}: not finite: {p.lstrip('/')}" for p in _nonfinite(rec, "")]
    for metric, unit, (low, high, inclusive) in CHECKED:
        m = _get(metrics, metric)
        if not isinstance(m, dict):
            continue
        if m.get("unit") != unit:
            problems.append(f"{name}: metrics.{metric}.unit is {m.get('unit')!r}, expected {unit!r}")
        value = m.get("value")
        if (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (isinstance(value, int) or math.isfinite(value))
                and not (low < value and (value <= high if inclusive else value < high))):
            problems.append(f"{name}: metrics.{metric} = {value} is out of bounds: valid ({low:g}, {high:g}"
                            + ("]" if inclusive else ")"))
    return problems


def check_records(records: list[tuple[str, Any]], *, min_repeats: int, system: Optional[str]) -> tuple[list[str], str]:
    """Every reason the submission cannot be accepted, and the system description it carries."""
    problems = [p for name, rec in records for p in check_record(name, rec)]
    dicts = [(n, r) for n, r in records if isinstance(r, dict)]
    platforms = sorted({str(r.get("platform")) for _, r in dicts})
    if len(platforms) > 1:
        problems.append(f"records from {len(platforms)} platforms ({', '.join(platforms)}): "
                        "one submission is one platform")
    seen: dict[str, str] = {}
    groups: dict[tuple, list[str]] = {}
    for name, rec in dicts:
        text = json.dumps(rec, sort_keys=True)
        if text in seen:
            problems.append(f"{name}: the same record as {seen[text]} (a repeat is a separate run)")
            continue
        seen[text] = name
        if validate_record(rec):
            continue  # already reported; its configuration key is not trustworthy
        try:
            config = json.dumps(record_config(ResultRecord.from_dict(rec, name)), sort_keys=True)
        except (KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{name}: config lacks what identifies the configuration: {exc!r}")
            continue
        groups.setdefault((rec["platform"], rec["benchmark"], config), []).append(name)
    if min_repeats < 1:
        problems.append(f"--min-repeats {min_repeats}: must be >= 1")
    for (platform, benchmark, config), names in sorted(groups.items()):
        if len(names) < min_repeats:
            problems.append(f"{platform} {benchmark} {config}: {len(names)} run(s) ({', '.join(names)}), "
                            f"at least {min_repeats} needed (--min-repeats)")
    outputs = [(n, r) for n, r in dicts if imported.is_imported(r)]
    if outputs and len(outputs) < len(dicts):
        problems.append(f"{len(outputs)} imported nccl-tests output(s) and {len(dicts) - len(outputs)} of the suite's "
                        "records: submit each kind on its own (their provenance differs)")
    elif outputs and min_repeats > 1 and any(len(names) < min_repeats for names in groups.values()):
        problems.append("an acceptance log of one nccl-tests run per op is submitted with --min-repeats 1")
    descriptions = [d for _, r in dicts if isinstance(d := _get(r, "config", "platform", "description"), str)
                    and d.strip()]
    if outputs:
        descriptions = [imported.system_of(outputs)]
    system = system if system is not None else (descriptions[0] if descriptions else "")
    if not system.strip() and dicts:   # no records: that is the problem already said
        problems.append("no system description: pass --system or describe the platform "
                        "(config.platform.description)")
    return problems, system


def history_commit(sha: str, root: Path = REPO_ROOT) -> tuple[Optional[str], Optional[str]]:
    """(the full commit, None) when `sha` (hex, 7 to 40 digits) names a commit of the history of the suite's
    own checkout at root (HEAD or an ancestor of it), else (None, why not)."""
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", sha):
        return None, f"--suite-commit {sha!r}: not a commit id (7 to 40 hex digits)"
    here = suite_identity(root)
    if here.startswith(CONTENT_PREFIX):
        return None, (f"--suite-commit {sha}: this suite is not a git checkout (its files hash to {here}), so "
                      "it cannot check that the commit is one of the suite's; submit from a checkout")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    try:
        full = git("rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}").stdout.strip()
        ancestor = bool(full) and git("merge-base", "--is-ancestor", full, "HEAD").returncode == 0
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"--suite-commit {sha}: git could not be asked ({exc})"
    if not ancestor:
        return None, (f"--suite-commit {sha}: not a commit of this suite's history (HEAD {here} and its ancestors)"
                      + ("" if full else ": no commit of this repository has that id (or it is ambiguous)"))
    return full, None


def given_commit(ref: Reference, sha: str, why: str) -> Reference:
    """ref with the suite commit the submitter gave: in suite_commit and the fingerprint's, what the
    records carried and why kept beside it (Provenance.suite_commit_given)."""
    p = ref.provenance
    recorded = (p.environment or {}).get("suite_commit", p.suite_commit)
    return dataclasses.replace(ref, provenance=dataclasses.replace(
        p, suite_commit=sha, environment={**(p.environment or {}), "suite_commit": sha},
        suite_commit_given={"recorded": recorded, "why": why}))


def _read_reference_file(path: Path, platform: str) -> dict[str, Any]:
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION,
                "description": f"References of the {platform} platform submitted with `python -m harness submit`.",
                "references": []}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, bad UTF-8
        raise SubmissionRejected([f"{path}: not a readable reference file: {exc}"]) from None
    problems = validate_reference_file(data)
    if problems:
        raise SubmissionRejected([f"{path}: invalid reference file: {p}" for p in problems])
    return data


def _merge(data: dict[str, Any], new: list[Reference], path: Path, replace: bool,
           reason: Optional[str]) -> list[Change]:
    held = [Reference.from_dict(e) for e in data["references"]]
    index = {r.identity(): i for i, r in enumerate(held)}   # a key on one machine
    machines: dict[tuple, list[str]] = {}
    for r in held:
        machines.setdefault(r.key(), []).append(r.machine())
    taken: dict[str, list[str]] = {}   # one line per configuration, its metrics listed (not a line per metric)
    pooled = set() if replace else {r.identity() for r in new if r.identity() in index and another_range(r, new, index)}
    for r in new:
        if r.identity() in index and r.identity() not in pooled:
            taken.setdefault(f"{r.platform} {r.benchmark} {json.dumps(r.config, sort_keys=True)} measured on "
                             f"{r.machine()}", []).append(r.metric)
    refused = [f"{path}: already has {what} ({', '.join(metrics)}); pass --replace --reason '...' to replace "
               f"{'them' if len(metrics) > 1 else 'it'}" for what, metrics in taken.items()]
    if refused and not replace:
        raise SubmissionRejected(refused)
    changes = []
    for ref in new:
        i = index.get(ref.identity())
        others = tuple(m for m in machines.get(ref.key(), ()) if m != ref.machine())   # kept beside it
        if i is None:
            data["references"].append(ref.to_dict())
            changes.append(Change("added", ref, path, others))
            continue
        old = Reference.from_dict(data["references"][i])
        if ref.identity() in pooled:   # a sweep of another range: its runs join the by-size reference's
            ref = pool(old, ref)
            data["references"][i] = ref.to_dict()
            changes.append(Change("pooled into", ref, path, others))
            continue
        src = old.provenance
        note = (f"{ref.provenance.note}; replaces {old.value} {old.unit} (samples {list(old.samples)}) from "
                f"{src.source if src else 'unknown source'}, {src.date if src else 'unknown date'}: {reason}")
        ref = dataclasses.replace(ref, provenance=dataclasses.replace(ref.provenance, note=note))
        data["references"][i] = ref.to_dict()
        changes.append(Change("replaced", ref, path, others))
    return changes


def submit(paths: list[Path], *, reference_file: Optional[Path] = None, replace: bool = False,
           reason: Optional[str] = None, min_repeats: int = 3, submitter: Optional[str] = None,
           system: Optional[str] = None, today: Optional[str] = None, suite_commit: Optional[str] = None,
           why: Optional[str] = None, reference_dir: Path = REFERENCE_DIR) -> list[Change]:
    """Check the records, then add their references to the platform's file; raises
    SubmissionRejected (nothing written) with every reason. `suite_commit` (with `why`) replaces the
    suite commit the records carry (history_commit checks it, given_commit writes it)."""
    records, problems = read_records([Path(p) for p in paths])
    checked, system = check_records(records, min_repeats=min_repeats, system=system)
    problems += checked
    given = None
    if suite_commit is not None:
        given, refused = history_commit(suite_commit)
        problems += [refused] if refused else []
        if not (why and why.strip()):
            problems.append("--suite-commit needs --why '...': why the records' suite_commit is wrong")
    elif why:
        warnings.warn("--why has no effect without --suite-commit", stacklevel=2)
    if replace and not (reason and reason.strip()):
        problems.append("--replace needs --reason '...': why the old reference is replaced")
    if reason and not replace:
        warnings.warn("--reason has no effect without --replace", stacklevel=2)
    if submitter is None:
        try:
            submitter = getpass.getuser()  # $LOGNAME, $USER, ... then the password database
        except (OSError, KeyError):
            submitter = ""
    if not submitter.strip():
        problems.append("--submitter is empty")
    if problems:
        raise SubmissionRejected(problems)
    platform = records[0][1]["platform"]
    tolerances = tolerances_for(platform)
    source = imported.SOURCE if imported.is_imported(records[0][1]) else SOURCE
    new = references_from_records([ResultRecord.from_dict(r, name) for name, r in records], source=source, submitter=submitter,
                                  date=today or Date.today().isoformat(), system=system, tolerance_pct=tolerances)
    new = [given_commit(r, given, why.strip()) for r in new] if given and why else new
    path = Path(reference_file) if reference_file is not None else Path(reference_dir) / f"{platform}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / LOCK_NAME, "a") as lock:  # beside the target: reference_results/.submit.lock
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file is closed
        data = _read_reference_file(path, platform)
        changes = _merge(data, new, path, replace, reason)
        problems = validate_reference_file(data)
        if problems:
            raise SubmissionRejected([f"{path}: the merged file would be invalid: {p}" for p in problems])
        write_json_atomic(path, data)
    return changes


def another_range(shared: Reference, new: list[Reference], index: dict[tuple, int]) -> bool:
    """A by-size reference the file has already, of runs of another size range than those it holds: its
    range's avg_busbw_gbps is new to the file (by_size.py pools every range's runs into one)."""
    twins = [r for r in new if r.metric == AVERAGE and r.platform == shared.platform
             and r.benchmark == shared.benchmark and sizeless(r.config) == shared.config]
    return shared.metric in BY_SIZE and bool(twins) and not any(r.identity() in index for r in twins)


def pool(old: Reference, new: Reference) -> Reference:
    """The by-size reference with the new runs beside the old, its value the median of all, the first runs'
    fingerprint kept and the new runs named in its note."""
    samples = old.samples + new.samples
    src = new.provenance
    note = f"{old.provenance.note if old.provenance else ''}; with {src.note} ({src.source}, {src.date}, {src.submitter})"
    return dataclasses.replace(old, value=statistics.median(samples), samples=samples,
                               by_size=old.by_size + new.by_size,
                               provenance=dataclasses.replace(old.provenance, note=note) if old.provenance else src)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad argument is bad input: exit 2
        raise HarnessError(f"{self.prog}: {message}")


def cli(args: list[str]) -> int:
    """python -m harness submit RESULTS... [--reference-file F] [--replace --reason R] [--min-repeats N]
    [--submitter NAME] [--system TEXT] [--suite-commit SHA --why TEXT]: check result records and add them
    to reference_results/."""
    parser = _Parser(prog="python -m harness submit",
                     description="Check result records and add them, with provenance, to the platform's "
                                 "reference file (reference_results/<platform>.json).")
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS",
                        help="result folders (every *.json but suite.json) or record files")
    parser.add_argument("--reference-file", type=Path, help="target file (default reference_results/<platform>.json)")
    parser.add_argument("--replace", action="store_true", help="replace existing references (needs --reason)")
    parser.add_argument("--reason", help="why the existing references are replaced (kept in the new entry's note)")
    parser.add_argument("--min-repeats", type=int, default=3, help="runs needed per configuration (default 3)")
    parser.add_argument("--submitter", help="who submits (default: the login user)")
    parser.add_argument("--system", help="system description (default: the platform's description)")
    parser.add_argument("--suite-commit", metavar="SHA",
                        help="the suite commit the records were made from, when theirs is wrong (a commit of this "
                             "checkout's history; needs --why); the records are not changed")
    parser.add_argument("--why", help="why the records' suite_commit is wrong (kept in each entry's provenance)")
    try:
        ns = parser.parse_args(args)
        changes = submit(ns.results, reference_file=ns.reference_file, replace=ns.replace, reason=ns.reason,
                         min_repeats=ns.min_repeats, submitter=ns.submitter, system=ns.system,
                         suite_commit=ns.suite_commit, why=ns.why)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(submitted_table(changes))
    given = {(p.suite_commit, p.suite_commit_given["recorded"]) for c in changes
             if (p := c.reference.provenance).suite_commit_given}
    for sha, recorded in sorted(given, key=str):
        print(f"suite_commit: {sha} as given (--suite-commit), not the records' {recorded}")
    return 0
