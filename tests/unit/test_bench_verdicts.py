"""What `bench` prints after its runs: the verdicts of what ran, and one line for every reference of
the platform that this run did not plan; the nightly lists each of a configuration its suite runs."""
from __future__ import annotations

import harness.bench
from harness.bench import compare_with_references
from harness.verdict.compare import compare, outside_runs
from harness.record import ResultRecord
from harness.verdict.references import Provenance, Reference, ReferenceTables
from harness.report.nightly import nightly_markdown
from harness.report.nightly_page import nightly_page

CONFIG = {"nodes": 1, "num_ranks": 2, "zero_stage": 2, "micro_batch_size": 4, "grad_acc_steps": 2, "seq_len": 128,
          "precision": "fp32", "activation_checkpointing": False}
METRICS = {"samples_per_s": ("samples/s", "higher", 22.0), "step_time_s": ("s", "lower", 0.36),
           "peak_mem_gib": ("GiB", "lower", 1.5)}


def ran(i: int, samples_per_s: float) -> ResultRecord:
    """One run of `bench suite=single zero=stage2` on the cpu platform."""
    values = {"samples_per_s": samples_per_s, "step_time_s": 8 / samples_per_s, "peak_mem_gib": 1.5}
    return ResultRecord(
        schema_version="1.0", run_id=f"00-llama-tiny-{i}", kind="training", benchmark="llama-tiny", platform="cpu",
        status="ok", reason=None, overrides=["zero=stage2"], microsteps=[],
        config={"platform": {"nodes": 1}, "zero": {"stage": 2},
                "workload": {"micro_batch_size": 4, "grad_acc_steps": 2, "seq_len": 128, "precision": "fp32"}},
        environment={"num_ranks": 2, "torch": "2.4.0"},
        metrics={k: {"value": v, "unit": METRICS[k][0]} for k, v in values.items()})


def table() -> list[Reference]:
    """The run's own configuration and 9 more the suite did not run (ZeRO 1-3 x three micro-batches), 3 metrics each."""
    configs = [{**CONFIG, "zero_stage": z, "micro_batch_size": mb, "grad_acc_steps": 8 // mb}
               for z in (1, 2, 3) for mb in (2, 4, 8)] + [{**CONFIG, "zero_stage": 2, "seq_len": 256}]
    prov = Provenance("suite", "me", "2026-05-01", "cpu box", {"num_ranks": 2, "torch": "2.4.0"})
    return [Reference("cpu", "llama-tiny", c, m, value, unit, direction, 25.0, "ok",
                      (value * 0.99, value, value * 1.01), prov)
            for c in configs for m, (unit, direction, value) in METRICS.items()]


def test_bench_prints_one_line_for_the_references_it_did_not_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(harness.bench, "read_references", lambda paths=None: ReferenceTables(table(), []))
    compare_with_references([ran(i, v) for i, v in enumerate([21.8, 22.1, 22.3])], tmp_path)
    printed = capsys.readouterr().out
    for text in (printed, (tmp_path / "compare.md").read_text()):
        assert "27 references (9 configurations) of cpu/llama-tiny had no result among these runs (not judged)" in text
        assert text.count("had no result") == 1
        assert "missing" not in text, "no row, no count and no note for a reference the run did not plan"
        assert "3 pass" in text
    assert "Compared with reference_results/ (3 pass)" in printed


def test_the_nightly_lists_a_missing_reference_only_of_a_configuration_its_suite_runs():
    """Found in a real `make nightly` on cpu: 24 of its 40 verdicts against the references were 'missing',
    the default suite's configurations that the nightly's suite never runs, every night."""
    import dataclasses

    tonight = [ran(i, v) for i, v in enumerate([21.8, 22.1, 22.3])]
    dropped = dataclasses.replace(ran(9, 22.0), config={**ran(9, 22.0).config, "zero": {"stage": 1}})
    verdicts, outside = outside_runs(compare(tonight, table()), tonight + [dropped])   # one run an earlier night ran
    assert {v.config["zero_stage"] for v in verdicts if v.verdict == "missing"} == {1}
    assert len(outside) == 24 and all(v.verdict == "missing" for v in outside)
    text = nightly_markdown("cpu", "2026-05-10", {"references": verdicts}, tonight, unrun=outside)
    assert text.count("| missing |") == 3                    # the configuration an earlier night ran
    assert ("24 references (8 configurations) of cpu/llama-tiny are of configurations the nightly's suite "
            "does not run (not judged)") in text
    assert "24 references" in nightly_page("cpu", "2026-05-10", {"references": verdicts}, tonight, {}, None, outside)