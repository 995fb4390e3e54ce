"""compare: verdicts on synthetic samples with a known shift and with none, and every edge case."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from harness.verdict.compare import bootstrap_interval, compare, decide, environment_diff
from harness.config.schema import REPO_ROOT
from harness.verdict.references import Provenance, Reference
from unit_helpers import typed

ENV = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.23.0",
       "nccl": "2.21.5", "driver": "550.54", "cuda": "12.4", "gpu_model": "H100", "gpu_count": 16,
       "container_image": None, "hosts": ["n1", "n2"], "num_nodes": 2, "num_ranks": 16,
       "env": {"NCCL_ALGO": "Ring"}, "suite_commit": "abc"}
CONFIG = {"nodes": 2, "num_ranks": 16, "zero_stage": 1, "micro_batch_size": 64, "grad_acc_steps": 4,
          "seq_len": 512, "precision": "bf16"}


def record(i: int, status: str = "ok", env: dict | None = None, **metrics) -> dict:
    """A schema-valid training record (harness.record.validate_record)."""
    env = env or ENV
    full = {"samples_per_s": (1.0, "samples/s"), "tokens_per_s": (1.0, "tokens/s"), "step_time_s": (1.0, "s"),
            "peak_mem_gib": (1.0, "GiB"), "mfu_pct": (1.0, "%")} if status == "ok" else {}
    return {"schema_version": "1.0", "run_id": f"r{i}", "kind": "training", "platform": "roce-h100",
            "benchmark": "llama-8b", "status": status, "reason": None if status == "ok" else "CUDA out of memory",
            "config": {"platform": {"nodes": 2}, "zero": {"stage": 1},
                       "workload": {"micro_batch_size": 64, "grad_acc_steps": 4, "seq_len": 512, "precision": "bf16"}},
            "overrides": [], "environment": env, "microsteps": [],
            "metrics": {name: {"value": v, "unit": unit} for name, (v, unit) in {**full, **metrics}.items()}}


def reference(samples, metric="samples_per_s", unit="samples/s", direction="higher", status="ok",
              value=None, config=CONFIG, env=ENV) -> Reference:
    import statistics

    value = value if value is not None or status != "ok" else statistics.median(samples)
    return Reference("roce-h100", "llama-8b", dict(config), metric, value, unit, direction, 5.0, status,
                     tuple(samples), Provenance("suite", "me", "2026-11-01", "x", env, "abc"))


def noisy(center: float, n: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(center, spread) for _ in range(n)]


@pytest.mark.parametrize("shift,direction,expected", [
    (0.0, "higher", "pass"),
    (-20.0, "higher", "regression"),     # samples/s 20% lower
    (+20.0, "higher", "improvement"),
    (+20.0, "lower", "regression"),      # step time 20% higher
    (-20.0, "lower", "improvement"),
    (-3.0, "higher", "pass"),            # within the 5% tolerance
])
def test_a_known_shift_is_found_and_no_shift_passes(shift, direction, expected):
    ref = reference(noisy(100.0, 8, 1.0, seed=1), direction=direction)
    current = noisy(100.0 + shift, 8, 1.0, seed=2)
    verdict, reason, fig = decide(current, ref)
    assert verdict == expected, reason
    assert fig["interval_pct"][0] <= fig["worse_pct"] <= fig["interval_pct"][1]


def test_noise_wider_than_the_shift_is_insufficient_data_not_a_regression():
    ref = reference([100.0, 60.0, 140.0, 100.0])
    verdict, reason, _ = decide([88.0, 130.0, 50.0], ref)
    assert verdict == "insufficient data" and "interval" in reason


def test_one_sample_on_each_side_cannot_judge_noise_unless_allowed():
    ref = reference([100.0])
    assert decide([70.0], ref)[0] == "insufficient data"
    assert decide([70.0], ref, min_samples=1)[0] == "regression"


@pytest.mark.parametrize("now, kind", [(46.0, "regression"), (150.0, "improvement")])
def test_one_sample_a_side_beyond_the_tolerance_says_which_way_it_looks_and_what_to_do(now, kind):
    """A nightly of one repeat 2.17x slower than the night before read 'noise cannot be judged' and 'what changed,
    with no regression': the cause now says it looks like a regression, and that running again decides it."""
    verdict, reason, _ = decide([now], reference([100.0]))
    assert verdict == "insufficient data"
    assert reason.startswith(f"one sample on each side: an apparent {kind} beyond the tolerance that noise cannot "
                             "be told from (run each side again); gain "), reason


def test_the_bootstrap_is_repeatable_and_brackets_the_shift():
    a = bootstrap_interval([90.0, 91.0, 89.0, 90.5], [100.0, 99.0, 101.0], "higher")
    assert a == bootstrap_interval([90.0, 91.0, 89.0, 90.5], [100.0, 99.0, 101.0], "higher")
    assert 7.0 < a[0] <= a[1] < 12.0


@pytest.mark.parametrize("samples,ref,fragment", [
    ([float("nan"), float("nan")], reference([100.0, 101.0]), "no finite sample"),
    ([10.0, 11.0], reference([0.0, 0.0], value=0.0), "reference value is 0.0"),
])
def test_values_that_cannot_be_compared_are_insufficient_data(samples, ref, fragment):
    verdict, reason, _ = decide(samples, ref)
    assert verdict == "insufficient data" and fragment in reason


def test_nan_samples_are_dropped_and_the_rest_decide():
    assert decide([float("nan"), 100.0, 101.0], reference([100.0, 100.5]))[0] == "pass"


def verdict_of(verdicts, metric="samples_per_s"):
    (v,) = [v for v in verdicts if v.metric == metric]
    return v


def test_a_regression_names_what_changed_in_the_environment():
    env = {**ENV, "nccl": "2.23.4", "env": {"NCCL_ALGO": "Tree"}}
    recs = [record(i, env=env, samples_per_s=(v, "samples/s")) for i, v in enumerate(noisy(70, 5, 1, 3))]
    v = verdict_of(compare(typed(recs), [reference(noisy(100, 5, 1, 4))]))
    assert v.verdict == "regression"
    assert v.environment_diff == {"nccl": ["2.21.5", "2.23.4"], "env.NCCL_ALGO": ["Ring", "Tree"]}


def test_status_changes_both_ways_and_same_status_passes():
    oom = [record(1, status="oom")]
    v = verdict_of(compare(typed(oom), [reference([100.0, 101.0])]))
    assert v.verdict == "status changed" and v.reason.startswith("ok -> oom") and "out of memory" in v.reason
    ok = [record(i, samples_per_s=(v, "samples/s")) for i, v in enumerate([90.0, 91.0])]
    assert verdict_of(compare(typed(ok), [reference([], status="oom")])).verdict == "status changed"
    assert verdict_of(compare(typed(oom), [reference([], status="oom")])).verdict == "pass"


def test_a_failed_run_of_a_known_configuration_is_its_status_rows_not_new_rows_of_metrics_it_never_had():
    """A rank killed mid-run: its references' metrics read 'status changed'; the metrics no reference of it holds
    (mfu_with_teacher_pct of a run without a teacher, ...) are not listed as 'new' beside them."""
    error = typed([record(1, status="error")])
    verdicts = compare(error, [reference([100.0, 101.0])])
    assert [(v.metric, v.verdict) for v in verdicts] == [("samples_per_s", "status changed")]
    unknown = compare(error, [])   # a configuration nobody measured: its failure is still shown, as new
    assert unknown and {v.verdict for v in unknown} == {"new"} and all("status error" in v.reason for v in unknown)


def test_a_metric_the_results_lack_is_missing_and_a_unit_mismatch_is_named():
    recs = [record(i, samples_per_s=(v, "samples/s")) for i, v in enumerate([100.0, 101.0])]
    for r in recs:
        del r["metrics"]["mfu_pct"]
    v = verdict_of(compare(typed(recs), [reference([1.0, 1.0], metric="mfu_pct", unit="%")]), "mfu_pct")
    assert v.verdict == "missing"
    recs = [record(i, peak_mem_gib=(v, "GB")) for i, v in enumerate([10.0, 10.0])]
    v = verdict_of(compare(typed(recs), [reference([10.0, 10.0], metric="peak_mem_gib", unit="GiB", direction="lower")]),
                   "peak_mem_gib")
    assert v.verdict == "insufficient data" and "unit mismatch" in v.reason


def test_new_results_and_references_without_results():
    recs = [record(i, samples_per_s=(v, "samples/s")) for i, v in enumerate([100.0, 101.0])]
    assert verdict_of(compare(typed(recs), [])).verdict == "new"
    other = reference([50.0, 51.0], config={**CONFIG, "micro_batch_size": 128})
    verdicts = compare(typed(recs), [other])
    assert {v.verdict for v in verdicts if v.metric == "samples_per_s"} == {"new", "missing"}


def test_a_published_reference_matches_on_the_keys_it_has():
    published = reference([92.35], config={"zero_stage": 1, "micro_batch_size": 64, "grad_acc_steps": 4}, env=None)
    recs = [record(i, samples_per_s=(v, "samples/s")) for i, v in enumerate([60.0, 61.0, 59.0])]
    v = verdict_of(compare(typed(recs), [published]))
    assert v.verdict == "regression"
    assert v.environment_diff == {"reference": "no environment fingerprint (a published figure)"}
    assert environment_diff(ENV, ENV) == {}


def test_a_published_reference_of_a_checkpointed_run_judges_only_checkpointed_runs():
    """The paper's Model 2 figures measured checkpointed runs (inferred): a run without checkpointing
    (a record made before the field existed included) is new, not a regression against them."""
    published = reference([92.35], config={"zero_stage": 1, "micro_batch_size": 64, "grad_acc_steps": 4,
                                           "seq_len": 512, "activation_checkpointing": True}, env=None)
    plain = [record(i, samples_per_s=(v, "samples/s")) for i, v in enumerate([60.0, 61.0, 59.0])]
    verdicts = [v for v in compare(typed(plain), [published]) if v.metric == "samples_per_s"]
    assert sorted((v.verdict, bool(v.run_ids)) for v in verdicts) == [("missing", False), ("new", True)]
    checkpointed = [{**r, "config": {**r["config"], "workload": {**r["config"]["workload"], "activation_checkpointing": True}}}
                    for r in plain]
    assert verdict_of(compare(typed(checkpointed), [published])).verdict == "regression"


def test_the_command_exits_1_on_regression_and_honours_fail_on(tmp_path):
    for i, v in enumerate(noisy(70, 4, 1, 5)):
        (tmp_path / f"r{i}.json").write_text(json.dumps(record(i, samples_per_s=(v, "samples/s"))))
    ref = {"schema_version": "1.0", "references": [reference(noisy(100, 4, 1, 6)).to_dict()]}
    (tmp_path / "ref.json").write_text(json.dumps(ref))

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "harness", "compare", str(tmp_path / "r0.json"),
                               str(tmp_path / "r1.json"), str(tmp_path / "r2.json"), str(tmp_path / "r3.json"),
                               "--reference", str(tmp_path / "ref.json"), *extra],
                              cwd=REPO_ROOT, capture_output=True, text=True)
    regressed = run()
    assert regressed.returncode == 1, regressed.stderr
    assert regressed.stdout.startswith("verdict") and "regression" in regressed.stdout
    assert "what changed since the reference: nothing in the fingerprint" in regressed.stdout
    assert run("--fail-on", "none").returncode == 0
    bogus = run("--fail-on", "slower")
    assert bogus.returncode == 2 and "--fail-on ['slower'] is invalid" in bogus.stderr
    (tmp_path / "r0.json").write_text('{"run_id": "x"}')
    bad = run()
    assert bad.returncode == 2 and "not a valid record" in bad.stderr


# --- what changed on the nodes: hardware and link rates (issue 15) ----------------------------

def cluster_env(*nodes: dict) -> dict:
    """ENV of a run whose nodes read their own machine (harness.record.environment)."""
    from harness.nodes import links

    return {**ENV, "machine": nodes[0]["machine"], "host": nodes[0]["host"], "nodes": list(nodes),
            "links": links(list(nodes))}


def test_one_nodes_slower_link_is_named_and_nothing_else():
    from unit_helpers import node

    before = cluster_env(node("node1", 1.0), node("node2", 1.0))
    after = cluster_env(node("node1", 1.0, load=1.9), node("node2", 0.25, load=0.1))
    assert environment_diff(before, after) == {"links.node2/eth0": [1.0, 0.25]}


def test_load_clocks_and_a_container_coming_and_going_are_no_change():
    from unit_helpers import node

    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "sm_clock_mhz": 1755, "power_limit_w": 700}
    before = cluster_env(node("node1", gpus=[gpu] * 8), node("node2", gpus=[gpu] * 8))
    busy = node("node2", load=63.0, mem_total_gib=7.749, gpus=[{**gpu, "sm_clock_mhz": 345}] * 8)
    busy["machine"]["nics"] = busy["machine"]["nics"][:1]          # the container's veth is gone
    assert environment_diff(before, cluster_env(node("node1", gpus=[gpu] * 8), busy)) == {}


@pytest.mark.parametrize("change,key,values", [
    ({"cpu_model": "Intel Xeon Platinum 8480+"}, "machine.node2.cpu_model",
     ["AMD EPYC 7763 64-Core Processor", "Intel Xeon Platinum 8480+"]),
    ({"logical_cpus": 1}, "machine.node2.logical_cpus", [2, 1]),
    ({"mem_total_gib": 3.8}, "machine.node2.mem_total_gib", [8, 4]),
    ({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}] * 7}, "machine.node2.gpu_count", [8, 7]),
    ({"gpus": [{"name": "NVIDIA H100 PCIe"}] * 8}, "machine.node2.gpu_model", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"]),
])
def test_hardware_that_sets_performance_is_named_per_node(change, key, values):
    from unit_helpers import node

    gpus = [{"name": "NVIDIA H100 80GB HBM3"}] * 8
    before = cluster_env(node("node1", gpus=gpus), node("node2", gpus=gpus))
    after = cluster_env(node("node1", gpus=gpus), node("node2", **{"gpus": gpus, **change}))
    assert environment_diff(before, after) == {key: values}


def test_other_nodes_of_the_same_kind_are_no_change_and_a_slower_one_is_named():
    from unit_helpers import node

    before = cluster_env(node("node1"), node("node2"))
    assert environment_diff(before, cluster_env(node("node7"), node("node8"))) == {}
    assert environment_diff(before, cluster_env(node("node7"), node("node8", 0.25))) == {
        "links.*/eth0": [[1.0], [0.25, 1.0]]}


def test_a_reference_from_before_node_fingerprints_compares_rank_0s_machine_only():
    from unit_helpers import node

    old = {**ENV, "host": "node1", "machine": node("node1")["machine"]}      # no nodes, no links
    assert environment_diff(old, cluster_env(node("node1"), node("node2", 0.25))) == {}
    slower_cpu = cluster_env(node("node1", cpu_model="AMD EPYC 7313"), node("node2"))
    assert environment_diff(old, slower_cpu) == {
        "machine.*.cpu_model": [["AMD EPYC 7763 64-Core Processor"], ["AMD EPYC 7313", "AMD EPYC 7763 64-Core Processor"]]}


def test_a_regression_on_a_slower_link_says_so():
    from unit_helpers import node

    now = cluster_env(node("node1"), node("node2", 0.25))
    recs = [record(i, env=now, samples_per_s=(v, "samples/s")) for i, v in enumerate(noisy(30, 5, 1, 3))]
    ref = reference(noisy(100, 5, 1, 4), env=cluster_env(node("node1"), node("node2")))
    v = verdict_of(compare(typed(recs), [ref]))
    assert v.verdict == "regression" and v.environment_diff == {"links.node2/eth0": [1.0, 0.25]}


def test_an_infiniband_port_at_a_lower_rate_is_named_by_host_and_port():
    before = {**ENV, "links": {"gpu1/mlx5_0/1": 400.0, "gpu2/mlx5_0/1": 400.0}}
    after = {**ENV, "links": {"gpu1/mlx5_0/1": 400.0, "gpu2/mlx5_0/1": 200.0}}
    assert environment_diff(before, after) == {"links.gpu2/mlx5_0/1": [400.0, 200.0]}


def test_compare_and_the_nightly_read_fail_on_alike():
    from harness import nightly
    from harness.verdict.compare import parse_fail_on
    from harness.errors import HarnessError

    assert parse_fail_on("regression,status_changed") == {"regression", "status changed"}
    assert parse_fail_on("regression, status changed") == {"regression", "status changed"}
    assert parse_fail_on("none") == set()
    for bad in ("slower", "", ","):
        with pytest.raises(HarnessError, match="--fail-on .* is invalid; valid: pass, regression"):
            parse_fail_on(bad)
    # the nightly takes the same words (it used to refuse status_changed) and refuses the same
    with pytest.raises(HarnessError, match=r"--fail-on \['slower'\] is invalid"):
        nightly.cli(["--store", "sqlite:////nonexistent/never-opened.sqlite", "--fail-on", "slower"])
    # the nightly alone also fails on a straggler (harness/held_up.py night_stragglers); compare refuses the word
    assert parse_fail_on("regression,straggler", also=("straggler",)) == {"regression", "straggler"}
    with pytest.raises(HarnessError, match=r"--fail-on \['straggler'\] is invalid"):
        parse_fail_on("straggler")
    with pytest.raises(HarnessError, match=r"valid: .*not comparable, straggler \(comma"):
        parse_fail_on("slower", also=("straggler",))


def test_a_pass_names_what_changed_too_and_a_moved_package_by_name():
    """A new image or a moved package is named whatever the verdict; a package the fingerprint does not
    name on its own comes from lock_mismatches (a side that does not list it is at the lock's pin)."""
    from harness.verdict.compare import package_diff
    from harness.report.verdicts import verdict_table
    old = {**ENV, "container_digest": "sha256:aaa", "lock_mismatches": {}}
    new = {**ENV, "container_digest": "sha256:bbb",
           "lock_mismatches": {"numpy": {"lock": "2.4.6", "seen": "2.3.0"}, "deepspeed": {"lock": "0.19.8", "seen": "0.19.7"}}}
    ref = reference(noisy(100, 5, 1, 4), env=old)
    recs = [record(i, env=new, samples_per_s=(v, "samples/s")) for i, v in enumerate(noisy(100, 5, 1, 3))]
    v = verdict_of(compare(typed(recs), [ref]))
    assert v.verdict == "pass"
    assert v.environment_diff == {"container_digest": ["sha256:aaa", "sha256:bbb"], "package.numpy": ["2.4.6", "2.3.0"]}
    text = verdict_table([v])
    assert "with no regression judged (pass" in text and "package.numpy: 2.4.6 -> 2.3.0" in text
    assert package_diff(None, new["lock_mismatches"]) == {}, "a side that did not read its packages: nothing"
    assert package_diff({"numpy": {"lock": "2.4.6", "seen": "2.3.0"}}, {}) == {"package.numpy": ["2.3.0", "2.4.6"]}
