"""Command line: python -m harness <command> [Hydra overrides]."""
from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import warnings
from pathlib import Path
from typing import Callable

from contract.spec import CollectiveSpec

from . import collect, nightly
from .verdict import alarms, compare, portability, submit
from .nccl_tests import importer as nccl_tests
from .verdict.ab import against
from .bench import bench, plan_suite
from .config.choices import RunKind
from .config.compose import compose, group_options
from .config.schema import CONF_DIR, GROUPS
from .errors import HarnessError
from .gpu_check import gpu_check
from .model import calibration
from .model.check import check_step_times, checkable, record_config
from .model.memory import memory_estimate
from .model.perfmodel import predict
from .model.sweep import sweep_configs
from .model.text import format_busbw, format_checks, format_prediction, format_sweep
from .model.traffic import busbw_table
from .model import published_runs
from .model.validation import format_validation, validate_model
from .multirun import split_flag
from .record import validate_record
from .verdict.record_files import read_json
from .verdict.cross_machine import this_machine
from .verdict.references import load_references
from .report.legend import item
from .report.verdicts import verdict_table, verdicts_json
from .report.sizes import size_tables
from .tune import command as tune_command

USAGE = "usage: python -m harness <command> [key=value ...]   (Hydra overrides, e.g. zero=stage2)"


def cmd_bench(args: list[str]) -> int:
    """Run the suite: every run launched, recorded (JSON per run) and summarised."""
    return bench(args)


def cmd_collect(args: list[str]) -> int:
    """collect OUT: records of the Slurm jobs submitted by hand from `bench platform.launcher=slurm --dry-run
    out=OUT` (job id, state, nodes; summary.md, compare.md); lists runs still pending, running or not submitted;
    run it again as more jobs end (exit 4 until every run is recorded)."""
    return collect.cli(args)


def cmd_gpu_check(args: list[str]) -> int:
    """On a node with NVIDIA GPUs: every collective through nccl and the paper's Model 1 under ZeRO 0-3 on this node's GPUs, MFU, measured vs predicted peak memory, the instrument's cost; records, gpu-check.md."""
    return gpu_check(args)


def cmd_plan(args: list[str]) -> int:
    """Compose and validate the suite; print each run's overrides and DeepSpeed config. Launches nothing."""
    multirun, overrides = split_flag(args)
    out, planned = plan_suite(overrides, multirun)
    print(f"out: {out}")
    for p in planned:
        print(f"\n{p.run.run_id}: {p.run.num_ranks} ranks, timeout {p.run.timeout_s:g} s")
        print(f"  overrides: {' '.join(p.run.overrides) or '-'}")
        spec = p.run.spec
        if isinstance(spec, CollectiveSpec):
            print(f"  collectives: {', '.join(spec.ops)}; {len(spec.sizes)} sizes "
                  f"{spec.sizes[0]}..{spec.sizes[-1]} B; {spec.dtype} {spec.redop}")
        else:
            mem = memory_estimate(p.cfg)
            print(f"  memory (performance model): {mem.total_gib:.1f} of {mem.capacity_gib:.1f} GiB per rank -> "
                  + ("fits" if mem.fits else "predicted OUT OF MEMORY"))
            print("  deepspeed: " + json.dumps(spec.deepspeed, sort_keys=True))
            if spec.distill:
                d = spec.distill
                zero3 = spec.deepspeed.get("zero_optimization", {}).get("stage") == 3
                print(f"  teacher: {d.teacher_precision}, {'sharded by ZeRO-3' if zero3 else 'replica per rank'}, "
                      f"{d.teacher_checkpoint or 'random weights'}; alpha {d.alpha}, T {d.temperature}")
    return 0


def cmd_validate(args: list[str]) -> int:
    """Check result record files against schemas/record.schema.json."""
    if not args:
        raise HarnessError("validate needs record files: python -m harness validate OUT/*.json")
    bad = 0
    for name in args:
        try:
            data = read_json(Path(name))
        except HarnessError as exc:
            print(exc)
            bad += 1
            continue
        problems = validate_record(data)
        bad += bool(problems)
        print(f"{name}: " + ("valid" if not problems else "INVALID\n  " + "\n  ".join(problems)))
    return 1 if bad else 0


def cmd_compare(args: list[str]) -> int:
    """Compare result records with the reference tables, or (--against OLD...) with other records: a
    verdict per run and metric (noise-aware), with the environment difference behind each regression.
    Exit 1 when one regressed."""
    parser = argparse.ArgumentParser(prog="python -m harness compare", description=cmd_compare.__doc__)
    parser.add_argument("results", nargs="+", help="record files or result folders (NEW)")
    parser.add_argument("--reference", action="append", type=Path,
                        help="reference file(s) (default: every reference_results/*.json)")
    parser.add_argument("--against", nargs="+", action="extend", metavar="OLD",
                        help="record files or result folders to judge NEW against instead of a reference table "
                             "(a before/after around an upgrade); repeated configurations pool their samples; a "
                             "configuration OLD ran only on another platform pairs with that, across two machines")
    parser.add_argument("--fail-on", default="regression",
                        help=f"comma list of verdicts that make the exit status 1, or none; valid: {', '.join(compare.VERDICTS)}")
    parser.add_argument("--min-samples", type=int, default=2,
                        help="samples needed on at least one side to judge noise (default 2)")
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument("--sizes", action="store_true",
                        help="after the table, each collective's busbw per message size both sides ran, now against "
                             "the reference's (the figures behind a verdict judged by size)")
    ns = parser.parse_args(args)
    fail_on = compare.parse_fail_on(ns.fail_on)
    if ns.against and ns.reference:
        raise HarnessError("--against and --reference exclude each other: --against judges NEW against the OLD records "
                           "given, --reference against reference tables; give one")
    if ns.against:
        verdicts, left = against(ns.results, ns.against, ns.min_samples)
        table = verdict_table(verdicts, missing="summary", ref_name="OLD")
        table += "".join(f"\n{line}" for line in item(left, markdown=False)) if left else ""   # wrapped to 120
    else:
        verdicts = compare.compare(compare.load_records(ns.results), load_references(ns.reference), ns.min_samples)
        table, left = verdict_table(verdicts, missing="summary"), ""
    if ns.json:
        print(verdicts_json(verdicts))
        if left:
            print(left, file=sys.stderr)
    else:
        if ns.sizes:
            table += "\n\n" + (size_tables(verdicts, "OLD" if ns.against else "reference")
                                or "no collective result has a by-size reference to show")
        print(table)
    return 1 if any(v.verdict in fail_on for v in verdicts) else 0


def cmd_nightly(args: list[str]) -> int:
    """The nightly regression job: the nightly suite with repeats, kept in a history store, compared
    with references and a rolling baseline; Markdown, HTML and JUnit reports; resumes a night."""
    return nightly.cli(args)


def cmd_submit(args: list[str]) -> int:
    """Check result records (schema, status ok, repeats, fingerprint, units, bounds) and add them with
    provenance to reference_results/<platform>.json; never overwrites without --replace --reason."""
    return submit.cli(args)


def cmd_import_nccl_tests(args: list[str]) -> int:
    """Turn nccl-tests outputs saved on a cluster (stdout or -J JSON) into collective records:
    import-nccl-tests FILE... [--out DIR] [--platform NAME] [--op OP]."""
    return nccl_tests.cli(args)


def cmd_portability(args: list[str]) -> int:
    """Pennycook's performance portability (harmonic mean of per-platform efficiencies, 0 when a
    platform is unsupported) from references or records; default: the published Model 2 figures."""
    return portability.cli(args)


def cmd_alarms(args: list[str]) -> int:
    """How often a regression one run of a bench read did not repeat (its reruns: confirm_regressions), per machine,
    platform and metric, and whether one run would do on each machine, from the history store:
    alarms [--store URL] [--platform P] [--all] [--markdown] [--json] [--false-alarms PCT]."""
    return alarms.cli(args)


def cmd_tune(args: list[str]) -> int:
    """The three-step tuning method (NCCL variables; micro-batch x grad-acc x ZeRO stage; DeepSpeed
    communication knobs), grid or Bayesian, guided by the performance model; resumable with the same
    out=; writes report.md and the best configuration as a suite preset and a DeepSpeed JSON."""
    return tune_command.cli(args)


def cmd_model(args: list[str]) -> int:
    """The performance model: memory per rank (out of memory or not), communication, step time,
    throughput and hours for a token budget of one configuration, or --sweep over ZeRO 1/2/3 x every
    (micro-batch, grad-acc) split of C; calibrated with --records (training and collective records) and
    --compute-records (another platform's training runs on the same machine); --against RUNS: the model
    against measured step times."""
    parser = argparse.ArgumentParser(prog="python -m harness model", description=cmd_model.__doc__)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. platform=roce-h100 workload=llama-8b-kd zero=stage2")
    parser.add_argument("--records", nargs="+", action="extend", default=[], metavar="DIR_OR_FILE",
                        help="result records or folders: training records (same platform, world size and workload) "
                             "calibrate the computation efficiency, collective records the busbw curves")
    parser.add_argument("--compute-records", nargs="+", action="extend", metavar="DIR_OR_FILE",
                        help="training records of another platform that ran on the same machine (same device, CPU or "
                             "GPU model and cores, as --records of the predicted platform show), same ranks and "
                             "workload, in profile mode: they alone calibrate the computation efficiency, e.g. the "
                             "single-node cpu platform's runs for cpu-cluster; --records still gives the busbw curves")
    parser.add_argument("--against", nargs="+", action="extend", metavar="DIR_OR_FILE",
                        help="measured training records to check: the model's step time for each record's own "
                             "configuration beside the measured one, with the error; calibrated on --records, "
                             "--compute-records and the collective records among these (never on the checked "
                             "training records themselves)")
    parser.add_argument("--max-error-pct", type=float, metavar="PCT",
                        help="with --against: exit 1 when a run's |error| is above PCT")
    parser.add_argument("--tokens", help="token budget for the hours estimate, e.g. 2e9")
    parser.add_argument("--sweep", action="store_true", help="a table over ZeRO 1/2/3 x every (micro-batch, grad-acc) split of C "
                                                             "(x --checkpointing, x --stack)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="with --sweep: each row also without activation checkpointing, every 4th and every 2nd "
                             "layer, selective and full (else the configuration's own)")
    parser.add_argument("--stack", action="store_true",
                        help="with --sweep: each row also under every training stack the platform allows, "
                             "workload.compile none/torch x workload.kernels eager/liger (else the configuration's own)")
    parser.add_argument("--busbw", action="store_true",
                        help="the bus-bandwidth curve the model uses on the platform, nccl-tests style (8 B to 2 GiB): "
                             "measured (--records) or NCCL's tuning model on the declared topology, with its algorithm")
    parser.add_argument("--no-references", action="store_true",
                        help="never calibrate from reference_results/ (used only when no training record qualifies)")
    parser.add_argument("--json", action="store_true", help="print the prediction(s) as JSON")
    parser.add_argument("--validate", action="store_true",
                        help="the model against every published SC'25 PMBS cell (reference_results/sc25-pmbs.json): OOM "
                             "calls, leave-one-out and one-cell-per-platform errors, the published findings; exit 1 if a "
                             "target is missed; then the published runs of other sources it never calibrated on "
                             "(reference_results/sources/published-runs/), reported apart")
    ns = parser.parse_intermixed_args(args)
    if ns.max_error_pct is not None and not ns.against:
        raise HarnessError("--max-error-pct applies to --against only")
    if ns.validate:
        if ns.overrides or ns.records or ns.compute_records or ns.against or ns.sweep or ns.tokens:
            raise HarnessError("--validate takes no overrides, --records, --compute-records, --against, --sweep or "
                               "--tokens: it validates the shipped workloads against the published table")
        v = validate_model(compose)
        runs = published_runs.predict_cells(compose)
        if ns.json:
            print(json.dumps({**v.to_dict(), "published_runs": [published_runs.as_dict(r) for r in runs]}, indent=2))
        else:
            print("\n".join([format_validation(v), *published_runs.format_cells(runs),
                             *published_runs.format_implied(published_runs.implied_links(compose, runs))]))
        return 0 if v.ok else 1
    override = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.]*=")

    def is_override(r: str) -> bool:  # `--records DIR key=value`: the override, not a path
        return bool(override.match(r)) and not Path(r).exists()

    lists = {k: getattr(ns, k) or [] for k in ("records", "compute_records", "against")}
    overrides = ns.overrides + [r for v in lists.values() for r in v if is_override(r)]
    paths = [r for r in lists["records"] if not is_override(r)]
    ns.compute_records = None if ns.compute_records is None else [r for r in ns.compute_records if not is_override(r)]
    ns.against = [r for r in lists["against"] if not is_override(r)]
    tokens = None
    if ns.tokens is not None:
        try:
            tokens = float(ns.tokens)
        except ValueError:
            tokens = math.nan
        if not (math.isfinite(tokens) and tokens > 0):
            raise HarnessError(f"--tokens {ns.tokens!r} is invalid: a positive number of tokens, e.g. 2e9")
    references = [] if ns.no_references else load_references()
    compute = None if ns.compute_records is None else calibration.load_records(ns.compute_records)
    if ns.against:
        if overrides or ns.sweep or ns.tokens:
            raise HarnessError("--against takes no overrides, --sweep or --tokens: each record is predicted in the "
                               "configuration it ran (its stored overrides)")
        against = calibration.load_records(ns.against)
        runs = [(rec, record_config(rec, compose)) for rec in checkable(against)]
        rows = check_step_times(runs, calibration.load_records(paths) + against, compute, references)
        print(json.dumps([r.to_dict() for r in rows], indent=2) if ns.json else format_checks(rows, ns.max_error_pct))
        bad = ns.max_error_pct is not None and any(abs(r.error_pct) > ns.max_error_pct for r in rows)
        return 1 if bad or not rows else 0
    cfg = compose(overrides)
    if cfg.kind != RunKind.training:
        raise HarnessError(f"kind={cfg.kind.value}: the performance model predicts training runs; use kind=training")
    records = calibration.load_records(paths)
    if ns.busbw:
        if ns.sweep or ns.tokens:
            raise HarnessError("--busbw takes no --sweep or --tokens: it prints the collectives' curve of one platform")
        rows = busbw_table(cfg, calibration.Calibration(busbw=calibration.busbw_curves(records, cfg)))
        p = cfg.platform
        print(json.dumps(rows, indent=2) if ns.json else
              format_busbw(rows, f"busbw on {p.name}: {p.nodes} node(s) x {p.gpus_per_node}, {p.world_size} ranks"))
        return 0
    if ns.checkpointing and not ns.sweep:
        raise HarnessError("--checkpointing widens a --sweep; give --sweep too, or set workload.activation_checkpointing, "
                           "workload.checkpoint_every_n_layers and workload.checkpoint_policy for one configuration")
    if ns.stack and not ns.sweep:
        raise HarnessError("--stack widens a --sweep; give --sweep too, or set workload.compile and workload.kernels "
                           "for one configuration")
    configs = sweep_configs(cfg, checkpointing=ns.checkpointing, stack=ns.stack) if ns.sweep else [cfg]
    p = cfg.platform   # a cpu table of several machines calibrates on this one's entries (calibration.of_machine)
    here = this_machine(p.name, p.device.value, p.launcher.value) if references else None
    preds = [predict(c, calibration.calibrate(records, c, references, compute_records=compute, machine=here), tokens)
             for c in configs]
    if ns.json:
        print(json.dumps([p.to_dict() for p in preds] if ns.sweep else preds[0].to_dict(), indent=2))
    else:
        print(format_sweep(preds) if ns.sweep else format_prediction(preds[0]))
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "bench": cmd_bench,
    "collect": cmd_collect,
    "plan": cmd_plan,
    "validate": cmd_validate,
    "compare": cmd_compare,
    "alarms": cmd_alarms,
    "submit": cmd_submit,
    "nightly": cmd_nightly,
    "import-nccl-tests": cmd_import_nccl_tests,
    "portability": cmd_portability,
    "model": cmd_model,
    "tune": cmd_tune,
    "gpu-check": cmd_gpu_check,
}
OWN_HELP = ("compare", "alarms", "submit", "nightly", "import-nccl-tests", "portability", "model", "collect")  # commands with their own argparse --help


def help_text() -> str:
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<18} {' '.join(fn.__doc__.split())}" for name, fn in COMMANDS.items()]
    lines += ["", f"config groups (choose with group=option; files in {CONF_DIR.name}/<group>/):"]
    lines += [f"  {g:<10} {', '.join(group_options(g))}" for g in GROUPS]
    lines += ["", "fields: any field by its path, e.g. workload.micro_batch_size=4 measure.steps=10",
              "        zero.overlap_comm=true deepspeed_config=my_ds.json out=results/mine",
              "", "examples:", "  python -m harness bench                      # cpu default suite",
              "  python -m harness bench suite=single zero=stage3 workload.micro_batch_size=4",
              "  python -m harness plan platform=h200",
              "  python -m harness bench -m suite=single kind=collective +nccl_env.NCCL_ALGO=Ring,Tree",
              "", "-m / --multirun: run every combination of sweep overrides (a,b  range()  choice())"]
    return "\n".join(lines)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    # SIGTERM (a CI job cancelled, a nightly stopped) unwinds like Ctrl-C: launchers kill their ranks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"error: unknown command {command!r}; valid: {', '.join(COMMANDS)}\n\n{help_text()}",
              file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in rest) and command not in OWN_HELP:
        print(f"python -m harness {command} [overrides]: {COMMANDS[command].__doc__.strip()}")
        return 0
    try:
        return COMMANDS[command](rest)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
