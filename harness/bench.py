"""The `bench` command: compose -> plan every run -> launch each -> record -> summary."""
from __future__ import annotations

import shlex
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Collection, Optional

import yaml

from contract import events as ev
from contract.fingerprint import IMAGE_VAR
from contract.spec import SPEC_FILE, CollectiveSpec

from .atomic import make_folder, write_bytes_atomic, write_text_atomic
from .verdict.baseline import baseline_text, judge
from .collectives import Row, format_table
from .verdict.compare import compare
from .verdict.alarms import keep_confirmations
from .verdict.confirmation import FirstReading, confirmed, rerun_name, section, to_confirm
from .config.choices import CollectiveSource, ContainerRuntime, Device, LauncherKind, RunKind
from .config.compose import compose
from .config.schema import REPO_ROOT, BenchConfig, PlatformConfig, to_dict
from .errors import HarnessError
from .launch.container import ImageDigests, Wrapper
from .launch.local import LaunchResult, LocalLauncher
from .launch.preflight import check as preflight_check
from .tune.parity import stack_parity
from .launch.slurm import SlurmLauncher
from .multirun import expand as multirun_expand
from .multirun import labels as multirun_labels
from .multirun import split_flag
from .nccl_tests.importer import nccl_tests_record
from .plan import COLD_CACHE, RunSpec, merge_overrides, plan_nccl_tests_runs, plan_rerun, plan_run, safe_name
from .provenance import suite_commit
from .record import ResultRecord, build_collective_records, build_record, write_json_atomic, write_record
from .verdict.references import read_references
from .report.plot import busbw_plot
from .report.summary import Progress, summary
from .report.verdicts import load_line, verdict_counts, verdict_table
from .report.sizes import under_table

CACHE_DIR = REPO_ROOT / ".cache"
DRY_RUN = "--dry-run"
DRY_RUN_MANIFEST = Path("slurm") / "dry-run.json"
"""What a dry run of Slurm jobs wrote (its overrides, each batch script and its runs): `collect` reads it."""
EXIT_RUN_FAILED = 3  # a run ended in error or timeout (an OOM is a result, not a failure)


@dataclass
class PlannedRun:
    cfg: BenchConfig
    run: RunSpec


def default_out(cfg: BenchConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return REPO_ROOT / "results" / f"{stamp}-{safe_name(cfg.platform.name)}"


def plan_suite(overrides: list[str], multirun: bool = False, out: Optional[Path] = None,
               images: Optional[ImageDigests] = None) -> tuple[Path, list[PlannedRun]]:
    """Compose and validate every run of the suite (of every multirun combination) before
    anything is launched. `out`: the results folder, whatever out= says (collect re-plans a dry run).
    `images` (checked_images()): each container image checked and its digest in the runs' environment;
    without it (`plan`, collect's re-planning) no image is looked at and the runs name none."""
    jobs = multirun_expand(overrides, multirun)
    first = compose(jobs[0])
    out = out or (Path(first.out).resolve() if first.out else default_out(first))
    planned: list[PlannedRun] = []
    index = 0                          # a run's place in the whole suite: its run id, with only= too
    for job, label in zip(jobs, multirun_labels(jobs)):
        tag = f"[{label}]" if len(jobs) > 1 else ""
        base = first if job is jobs[0] else compose(job)
        if not base.suite.runs:
            name = base.workload.name if base.kind == RunKind.training else f"collectives-{base.collective.name}"
            runs = plan_runs(base, name + tag, index, job, out, images)
            planned += runs
            index += len(runs)
        for entry in base.suite.runs:
            run_overrides = merge_overrides(job, [f"kind={entry.kind.value}", *entry.overrides])
            try:
                cfg = compose(run_overrides)
            except HarnessError as exc:
                raise HarnessError(f"suite {base.suite.name}, run {entry.name}: {exc}") from None
            runs = plan_runs(cfg, entry.name + tag, index, run_overrides, out, images)
            index += len(runs)
            if not base.only or entry.name in base.only:
                planned += runs
    return out, planned


def plan_runs(cfg: BenchConfig, name: str, index: int, overrides: list[str], out: Path,
              images: Optional[ImageDigests] = None) -> list[PlannedRun]:
    if cfg.kind == RunKind.collective and cfg.collective.source == CollectiveSource["nccl-tests"]:
        runs = plan_nccl_tests_runs(cfg, name, index, overrides, out, REPO_ROOT, CACHE_DIR, images)
    else:
        runs = [plan_run(cfg, name, index, overrides, out, REPO_ROOT, CACHE_DIR, images)]
    return [PlannedRun(cfg, run) for run in runs]


def refuse_existing_results(out: Path, planned: list[PlannedRun]) -> None:
    """Results already in OUT are never overwritten: stop before anything launches."""
    taken = [str(p.run.run_dir) for p in planned if p.run.run_dir.exists() and any(p.run.run_dir.iterdir())]
    taken += [str(out / f"{p.run.run_id}.json") for p in planned if (out / f"{p.run.run_id}.json").exists()]
    if taken:
        raise HarnessError(f"out={out} already holds results of this suite ({taken[0]}"
                           f"{f' and {len(taken) - 1} more' if len(taken) > 1 else ''}); choose a new out=")


def prepare_run_dir(run: RunSpec) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    drop_compile_cache(run)   # a relaunch into the folder (a resumed tune) compiles cold too
    write_text_atomic(run.run_dir / SPEC_FILE, run.spec.to_json())
    write_text_atomic(run.run_dir / "config.yaml", yaml.safe_dump(run.config, sort_keys=False))


def drop_compile_cache(run: RunSpec) -> None:
    """Remove the run folder's cold compile cache (harness/plan.py compile_cache_env): what the ranks compiled
    is no part of the results, and a GPU run's Triton kernels weigh hundreds of MB."""
    shutil.rmtree(run.run_dir / COLD_CACHE, ignore_errors=True)


def describe(p: PlannedRun) -> str:
    run = p.run
    if isinstance(run.spec, CollectiveSpec):
        return f"collectives {', '.join(run.spec.ops)}, {len(run.spec.sizes)} sizes"
    return (f"{p.cfg.workload.name} ZeRO-{p.cfg.zero.stage} mb {p.cfg.workload.micro_batch_size}"
            f" x ga {p.cfg.workload.grad_acc_steps}")


def total_steps(run: RunSpec) -> int:
    if isinstance(run.spec, CollectiveSpec):
        return len(run.spec.ops) * len(run.spec.sizes)
    return run.spec.stack.planned_warmup(run.spec.warmup_steps) + run.spec.steps + run.spec.profile_steps


def image_of(platform: PlatformConfig, run: RunSpec) -> Optional[str]:
    return run.env.get(IMAGE_VAR) if platform.container.runtime != ContainerRuntime.none else None


def checked_images(dry_run: bool = False) -> ImageDigests:
    """For planning what will launch: each image checked before anything launches (a dry run prints
    a failed check as a note), its digest told to the ranks."""
    return ImageDigests(CACHE_DIR, dry_run)


def slurm_launcher(p: PlannedRun, out: Path, progress: dict[str, Progress]) -> SlurmLauncher:
    return SlurmLauncher(p.cfg.platform, REPO_ROOT, out, image_of(p.cfg.platform, p.run),
                         on_poll=lambda run: progress[run.run_id].poll())


def local_launcher(p: PlannedRun, out: Path, progress: Optional[Progress] = None) -> LocalLauncher:
    image = image_of(p.cfg.platform, p.run)
    wrapper = Wrapper(p.cfg.platform.container, image, REPO_ROOT, out,
                      p.cfg.platform.device == Device.cuda) if image else None
    return LocalLauncher(on_poll=progress.poll if progress else None, wrapper=wrapper)


def array_groups(planned: list[PlannedRun], multirun: bool) -> list[list[PlannedRun]]:
    """Runs in launch order, grouped: a sweep's runs under Slurm form one job array when they share
    the platform (same nodes, GPUs, image) and report through events; every other run is alone."""
    groups: list[list[PlannedRun]] = []
    for p in planned:
        last = groups[-1][-1] if groups else None
        if (multirun and last is not None and p.cfg.platform.launcher == LauncherKind.slurm
                and p.run.output == "events" == last.run.output
                and to_dict(p.cfg.platform) == to_dict(last.cfg.platform)
                and image_of(p.cfg.platform, p.run) == image_of(last.cfg.platform, last.run)):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def dry_run(planned: list[PlannedRun], out: Path, multirun: bool, overrides: Optional[list[str]] = None) -> list[Path]:
    """Write what would be launched, submit nothing: each Slurm batch script (a sweep's job array),
    or each local run's rank commands as a shell script; for Slurm jobs also DRY_RUN_MANIFEST."""
    written, jobs = [], []
    for group in array_groups(planned, multirun):
        for p in group:
            prepare_run_dir(p.run)
        first = group[0]
        if first.cfg.platform.launcher == LauncherKind.slurm:
            launcher = slurm_launcher(first, out, {})
            written.append(launcher.write_array_script([p.run for p in group]) if len(group) > 1
                           else launcher.write_script(first.run))
            jobs.append({"script": str(written[-1].relative_to(out)), "array": len(group) > 1,
                         "runs": [p.run.run_id for p in group]})
        else:
            written.append(write_local_script(first, local_launcher(first, out)))
    if jobs:
        write_json_atomic(out / DRY_RUN_MANIFEST, {
            "suite": planned[0].cfg.suite.name, "overrides": list(overrides or []), "multirun": multirun,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "suite_commit": suite_commit(),
            "jobs": jobs, "collect": "submit each script with sbatch, then: python -m harness collect OUT"})
    return written


def write_local_script(p: PlannedRun, launcher: LocalLauncher) -> Path:
    lines = ["#!/bin/bash", f"# run {p.run.run_id}: {p.run.num_ranks} local ranks (platform {p.cfg.platform.name}); "
             "what `python -m harness bench` would start", "set -u", f"cd {shlex.quote(str(REPO_ROOT))}"]
    for rank, (argv, env) in enumerate(launcher.commands(p.run, 29500)):
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        lines.append(f"env {assigns} {shlex.join(argv)} > {shlex.quote(str(p.run.run_dir / f'rank{rank}.log'))} 2>&1 &")
    lines.append("wait")
    path = p.run.run_dir / "launch.sh"
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def execute(planned: list[PlannedRun], out: Path, multirun: bool = False,
            keep_compile_cache: Collection[str] = ()) -> list[ResultRecord]:
    """Launch and record the planned runs; the cold compile caches of the runs named in `keep_compile_cache`
    outlive their launch, for a caller that launches the same compiled model again and drops them itself."""
    unbuilt = preflight_check(planned)  # stale lock files of torch's JIT; the DeepSpeed ops the runs need
    records = []
    n = 0
    for group in array_groups(planned, multirun):
        progress = {}
        for p in group:
            n += 1
            run = p.run
            print(f"[{n}/{len(planned)}] {run.run_id}: {describe(p)}, {run.num_ranks} ranks on "
                  f"{p.cfg.platform.name}", flush=True)
            prepare_run_dir(run)
            progress[run.run_id] = Progress(run.run_dir / ev.EVENTS_FILE, run.run_id, total_steps(run))
        first = group[0]
        if first.run.run_id in unbuilt:    # local runs only: their group is the run
            records.extend(record_run(first, LaunchResult({}, False, 0.0, cause=unbuilt[first.run.run_id]), out))
            continue
        if first.cfg.platform.launcher == LauncherKind.slurm:
            launcher = slurm_launcher(first, out, progress)
            if len(group) > 1:
                launches = launcher.run_array([p.run for p in group])
            else:
                launches = {first.run.run_id: launcher.run(first.run, cwd=REPO_ROOT)}
        else:
            launches = {first.run.run_id: local_launcher(first, out, progress[first.run.run_id])
                        .run(first.run, cwd=REPO_ROOT)}
        for p in group:
            progress[p.run.run_id].poll()
            if p.run.name not in keep_compile_cache:
                drop_compile_cache(p.run)
            records.extend(record_run(p, launches[p.run.run_id], out))
    return records


def record_run(p: PlannedRun, launch: LaunchResult, out: Path) -> list[ResultRecord]:
    new = run_records(p, launch, out)
    for record in new:
        write_and_show(record, p.run, launch, out)
    return new


def run_records(p: PlannedRun, launch: LaunchResult, out: Path) -> list[ResultRecord]:
    """The run's records (a built-in collective sweep: one per op), its busbw plot drawn."""
    run = p.run
    if run.output == "nccl-tests":
        new = [nccl_tests_record(run, p.cfg, launch)]
        plot_collectives(new, p.cfg, out / f"{run.run_id}-busbw.png")
    elif isinstance(run.spec, CollectiveSpec):
        new = build_collective_records(run, p.cfg, launch)
        plot_collectives(new, p.cfg, out / f"{run.run_id}-busbw.png")
    else:
        new = [build_record(run, p.cfg, launch)]
    return new


def write_and_show(record: ResultRecord, run: RunSpec, launch: LaunchResult, out: Path) -> Path:
    path = write_record(record, out)
    rows = record.rows or (record.smoke or {}).get("rows")
    if rows:
        print(format_table(record.benchmark, [Row.from_dict(r) for r in rows], run.num_ranks), flush=True)
    value = record.metrics.get("samples_per_s") or record.metrics.get("avg_busbw_gbps")
    done = (f"{value['value']:.2f} {value['unit']}" if value
            else record.reason or (record.smoke or {}).get("reason"))
    for problem in record.environment.get("hardware_mismatch") or []:
        print(f"  warning: {run.run_id}: {problem}", flush=True)
    print(f"  -> {record.status}: {done}  ({launch.wall_s:.1f} s; {path.relative_to(out)})", flush=True)
    return path


def plot_collectives(records: list[ResultRecord], cfg: BenchConfig, path: Path) -> None:
    """busbw against size per collective, the platform's declared link bandwidths as ceilings."""
    series = {r.benchmark: [(row["size_bytes"], row["out_of_place"]["busbw_gbps"]) for row in r.rows]
              for r in records if r.rows}
    if not series:
        return
    p = cfg.platform
    busbw_plot(series, path, title=f"{p.name}: busbw by message size ({p.world_size} ranks, out-of-place)",
               ceilings_gbps={"intra-node": p.intra_node_bw_gbps, "inter-node (per node)": p.inter_node_bw_gbps})
    for r in records:
        r.plot = path.name


def compare_with_references(records: list[ResultRecord], out: Path, history: str = "none",
                            first: Optional[FirstReading] = None, times: int = 0) -> None:
    """The verdicts against reference_results/, then, for what no reference of this machine judged,
    against this machine's earlier bench runs (harness/verdict/baseline.py; `history`: the config key),
    printed and written as compare.md; `bench`'s exit status does not depend on them:
    `python -m harness compare` and the nightly job decide that. `first`: the verdicts of the first runs alone
    where regressions among them were run again `times` times (confirm_regressions): what that found follows, and is
    kept in the history store (harness/verdict/alarms.py)."""
    tables = read_references()  # a table that does not parse is left out and named, never the end of a bench
    verdicts = compare(records, tables.references)
    counts = verdict_counts(verdicts)  # references this run did not plan: one line under the table, not rows
    left_out = "".join(f"reference table left out: {e.line()}; fix it or move it out of reference_results/\n\n"
                       for e in tables.unreadable)
    base = judge(records, verdicts, history, out)
    machine = load_line(records)
    text = baseline_text(base, verdict_table(base.verdicts, ref_name="baseline"))
    found = confirmed(first, verdicts + base.verdicts, records) if first is not None else []
    again = section(found, times)
    kept = keep_confirmations(first, found, records, history, out, times) if first is not None else ""
    again = "\n".join(x for x in (again, kept) if x)   # where it was kept, or why it was not
    print(f"\n{machine}\n\nCompared with reference_results/ ({counts}):\n\n{left_out}"
          + verdict_table(verdicts, missing="summary")
          + (f"\n\n{text}" if text else "") + (f"\n\n{again}" if again else ""))
    md = baseline_text(base, under_table(verdict_table(base.verdicts, markdown=True, ref_name="baseline"),
                                         base.verdicts, "baseline"))
    table = under_table(verdict_table(verdicts, markdown=True, missing="summary"), verdicts, "reference")
    write_bytes_atomic(out / "compare.md", (f"# Compared with reference_results/\n\n{machine}\n\n{counts}\n\n"
                                            f"{left_out}{table}\n"
                                            + (f"\n# This machine's baseline\n\n{md}\n" if md else "")
                                            + (f"\n# Regressions run again\n\n{again}\n" if again else "")
                                            ).encode("utf-8"))


def first_verdicts(records: list[ResultRecord], out: Path, history: str) -> FirstReading:
    """The verdicts of `records` against reference_results/ and this machine's baseline, nothing kept."""
    verdicts = compare(records, read_references().references)
    return FirstReading(verdicts, judge(records, verdicts, history, out, keep=False).verdicts)


def confirm_regressions(records: list[ResultRecord], planned: list[PlannedRun], out: Path,
                        images: Optional[ImageDigests] = None,
                        keep_compile_cache: Collection[str] = ()) -> tuple[list[ResultRecord], Optional[FirstReading]]:
    """Each run whose first records read a regression, run `confirm_regressions` times more, interleaved (every
    such run once, then again), after the suite (harness/verdict/confirmation.py): the records of all runs, and
    the first runs' verdicts (None when they were not judged for it: confirm_regressions=0, or the reruns could
    not be launched)."""
    times, history = planned[0].cfg.confirm_regressions, planned[0].cfg.history
    if times < 1 or not records:
        return records, None
    first = first_verdicts(records, out, history)
    ids = to_confirm(first.all, {p.run.run_id: p.run.record_ids() for p in planned})
    if not ids:
        return records, first
    took = sum(max((r.wall_s for r in records if r.run_id in p.run.record_ids()), default=0.0)   # a sweep's records
               for p in planned if p.run.run_id in ids)                                         # share its wall time
    print(f"\n{len(ids)} run(s) read a regression in their first run ({', '.join(ids)}): each runs {times} more "
          f"time(s) to confirm it (about {times * took:.0f} s: their first runs took {took:.0f} s; "
          f"confirm_regressions={times}; 0: none)", flush=True)
    try:
        again = [PlannedRun(p.cfg, plan_rerun(p.run, p.cfg, rerun_name(p.run.name, k), out, REPO_ROOT, CACHE_DIR,
                                              images))
                 for k in range(1, times + 1) for p in planned if p.run.run_id in ids]
        return records + execute(again, out, keep_compile_cache=keep_compile_cache), first
    except HarnessError as exc:   # the first runs' records are written: their summary and verdicts still are
        print(f"the regressions were not run again: {exc}", flush=True)
        return records, None


def write_results(records: list[ResultRecord], out: Path, suite: str, overrides: list[str], history: str = "none",
                  first: Optional[FirstReading] = None, times: int = 0, **more) -> None:
    """The summary (printed and summary.md), suite.json (with `more`) and compare.md of these records."""
    parity = stack_parity(records)
    said = ("Loss parity of the stack's variants against eager (same seed, step by step; harness/tune/parity.py)\n"
            + "\n".join("  " + p.line() for p in parity) + "\n") if parity else ""
    print("\n" + summary(records) + ("\n" + said if said else ""))
    write_bytes_atomic(out / "summary.md", (f"# Results in {out.name}\n\n" + summary(records, markdown=True)
                                            + ("\n## " + said if said else "")).encode("utf-8"))
    write_json_atomic(out / "suite.json", {"suite": suite, "overrides": overrides, "runs": [r.run_id for r in records],
                                           "statuses": {r.run_id: r.status for r in records}, **more})
    compare_with_references(records, out, history, first, times)


def bench(args: list[str], keep_compile_cache: Collection[str] = ()) -> int:
    dry = DRY_RUN in args
    multirun, overrides = split_flag([a for a in args if a != DRY_RUN])
    images = checked_images(dry)
    out, planned = plan_suite(overrides, multirun, images=images)
    refuse_existing_results(out, planned)
    make_folder(out)
    if dry:
        scripts = dry_run(planned, out, multirun, overrides)
        print(f"dry run of suite {planned[0].cfg.suite.name} ({len(planned)} runs): nothing launched; "
              f"{len(scripts)} script(s) written:")
        for path in scripts:
            print(f"  {path}")
        if (out / DRY_RUN_MANIFEST).exists():
            print(f"submit each with sbatch; as the jobs end, `python -m harness collect {out}` writes their records "
                  "(again until it exits 0; docs/clusters.md)")
        return 0
    print(f"suite {planned[0].cfg.suite.name}: {len(planned)} runs -> {out}", flush=True)
    records = execute(planned, out, multirun, keep_compile_cache)
    records, first = confirm_regressions(records, planned, out, images, keep_compile_cache)
    write_results(records, out, planned[0].cfg.suite.name, overrides, planned[0].cfg.history, first,
                  planned[0].cfg.confirm_regressions)
    print(f"records, summary.md and run logs in {out}")
    return EXIT_RUN_FAILED if any(r.status in ("error", "timeout") for r in records) else 0
