"""Machines are known by what they measure (issue 26): the capability probe in a record decides
whether a reference can judge a run; the differing figure is said in words; a reference without a
probe is "machine not measured"; the efficiency against each machine's own measured matmul rate
is judged across machines, and said so."""
from __future__ import annotations

import copy
import json
import multiprocessing
import socket
import time
from pathlib import Path

import pytest
from test_compare import ENV, record, reference
from test_not_comparable import cpu_env

import benchmarks.node.probe as probe_module
from benchmarks.node.probe import cpu_flags, isa_class, node_probe, pulse
from contract.metrics import METRICS
from harness.verdict.compare import compare, environment_diff
from harness.pace import pace
from harness.probe import capacity_gflops, differences, efficiency_pct, not_comparable, probe_diff, summary_line
from unit_helpers import typed

CPUINFO_AVX2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma bmi2\n"
CPUINFO_SPR = "processor\t: 0\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def probe(isa: str = "AVX2", fp32: float = 80.0, bf16: float = 1.2, triad: float = 30.0, other: float = 0.0,
          flags: str = CPUINFO_AVX2, aten: str | None = None, host: str = "vm", steal: float | None = None) -> dict:
    has = {f: f in cpu_flags(flags) for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")}
    return {"schema_version": "1", "host": host, "device": "cpu", "took_s": 3.3, "usable_cpus": 2,
            "isa": {"torch_cpu_capability": isa, "flags": has, "class": isa_class(isa, has),
                    "aten_cpu_capability_env": aten, "governor": None},
            "matmul": {"fp32": {"best": fp32, "median": fp32, "spread_pct": 3.0, "unit": "GFLOP/s", "n": 512},
                       "bf16": {"best": bf16, "median": bf16, "spread_pct": 2.0, "unit": "GFLOP/s", "n": 512}},
            "triad": {"best": triad, "median": triad, "spread_pct": 8.0, "unit": "GB/s"}, "other_cpus": other,
            **({} if steal is None else {"steal_cpus": steal})}


def env_with(p: dict | None, model: str = "AMD EPYC") -> dict:
    env = copy.deepcopy(cpu_env(model))
    env["machine"]["probe"] = p
    return env


def test_isa_class_reads_torch_capability_and_the_bf16_units():
    assert cpu_flags(CPUINFO_AVX2) >= {"avx2", "fma"} and "avx512f" not in cpu_flags(CPUINFO_AVX2)
    spr = {f: f in cpu_flags(CPUINFO_SPR) for f in ("avx512f", "avx512_bf16", "amx_bf16")}
    assert isa_class("AVX512", spr) == "AVX512 +avx512_bf16 +amx_bf16"
    assert isa_class("DEFAULT", {}) == "DEFAULT"


@pytest.mark.parametrize("ref,cur,words", [
    (probe(), probe(fp32=84.0, bf16=1.15, triad=26.0), []),                      # within every tolerance
    (probe("AVX512", fp32=160.0, bf16=79.0, flags=CPUINFO_SPR), probe(),
     ["fp32 matmul 80 vs 160 GFLOP/s per core; bf16 matmul 1.2 vs 79 GFLOP/s per core: "
      "this CPU lacks AVX-512, AVX-512 BF16, AMX (bf16 tiles) (ISA AVX2 vs AVX512 +avx512_bf16 +amx_bf16)"]),
    (probe(), probe("DEFAULT", aten="default"),
     ["ISA DEFAULT vs AVX2: torch's vectorised CPU kernels are off here (CPU capability DEFAULT, "
      "ATEN_CPU_CAPABILITY=default)"]),
    (probe(), probe(fp32=40.0, other=2.0),
     ["fp32 matmul 40 vs 80 GFLOP/s per core; other work during the probe 2.0 vs 0.0 CPUs (busier here)"]),
    (probe(steal=0.0), probe(fp32=40.0, steal=0.9),
     ["fp32 matmul 40 vs 80 GFLOP/s per core; the hypervisor's steal during the probe 0.9 vs 0.0 CPUs (busier here)"]),
    (probe(), probe(triad=10.0), ["memory bandwidth (triad) 10 vs 30 GB/s"]),
], ids=["same box", "AVX-512 BF16 reference", "ATEN_CPU_CAPABILITY=default", "busier", "stolen", "slower memory"])
def test_two_probes_differ_by_measured_figures_in_words(ref, cur, words):
    assert differences(ref, cur) == words


def _verdicts(ref_env: dict, run_env: dict, factor: float = 0.5, metric: str = "samples_per_s") -> list:
    unit = "samples/s" if metric == "samples_per_s" else "%"
    ref = reference([100.0, 101.0, 99.0], env=ref_env, metric=metric, unit=unit)
    runs = [record(i, env=run_env, **{metric: (v * factor, unit)})
            for i, v in enumerate([100.0, 99.5, 100.5])]
    return [v for v in compare(typed(runs), [ref]) if v.metric == metric]


def test_a_slower_box_of_the_same_name_is_not_comparable_never_a_regression():
    fast = env_with(probe("AVX512", fp32=160.0, bf16=79.0, flags=CPUINFO_SPR))
    (v,) = _verdicts(fast, env_with(probe()))
    assert v.verdict == "not comparable"
    assert "bf16 matmul 1.2 vs 79 GFLOP/s per core" in v.reason and "this CPU lacks AVX-512, AVX-512 BF16" in v.reason


def test_a_reference_without_a_probe_is_machine_not_measured():
    (v,) = _verdicts(cpu_env("AMD EPYC"), env_with(probe()))
    assert v.verdict == "not comparable" and v.reason.startswith("not comparable: machine not measured")
    assert not_comparable(ENV, env_with(probe())).startswith("not comparable: machine not measured")


def test_the_same_measured_machine_is_judged_and_a_run_without_a_probe_by_name_as_before():
    assert [v.verdict for v in _verdicts(env_with(probe()), env_with(probe(fp32=78.0)))] == ["regression"]
    assert [v.verdict for v in _verdicts(cpu_env("AMD EPYC"), cpu_env("AMD EPYC"))] == ["regression"]


def test_the_efficiency_is_judged_across_machines_and_says_so():
    fast = env_with(probe("AVX512", fp32=160.0, bf16=79.0, flags=CPUINFO_SPR))
    (v,) = _verdicts(fast, env_with(probe()), metric="matmul_eff_pct")
    assert v.verdict == "regression" and v.reason.startswith("across machines (fp32 matmul 80 vs 160")
    (same,) = _verdicts(fast, env_with(probe()), factor=1.0, metric="matmul_eff_pct")
    assert same.verdict == "pass" and "across machines" in same.reason


def _kd_verdict(ref_env: dict, run_env: dict, factor: float) -> object:
    """matmul_eff_pct of a run whose parts are in two dtypes (a distillation: fp32 student, bf16 teacher)."""
    ref = reference([62.0, 62.5, 61.5], env=ref_env, metric="matmul_eff_pct", unit="%")
    runs = [record(i, env=run_env, matmul_eff_pct=(v * factor, "%")) for i, v in enumerate([62.0, 61.5, 62.5])]
    for r in runs:
        r["metrics"]["matmul_eff_pct"]["measured_gflops"] = {"fp32": 225.3, "bf16": 977.8}
    (v,) = [v for v in compare(typed(runs), [ref]) if v.metric == "matmul_eff_pct"]
    return v


def test_an_efficiency_over_two_dtypes_is_not_judged_where_their_rates_stand_in_another_ratio():
    """A fresh clone's first bench on an AVX-512 BF16 box called its distillation run a regression against
    the AVX2 box's reference (matmul_eff_pct 38.7 vs 62.3 %, same code): there bf16 runs at 0.10x fp32,
    here at 4.3x, so the teacher's bf16 forward is most of the ideal time on one and almost none on the
    other. Such a pair is not comparable, in words; one dtype, or the same ratio, is judged as before."""
    avx2 = env_with(probe(fp32=71.2, bf16=7.4))
    amx = env_with(probe("AVX512", fp32=113.0, bf16=489.0, flags=CPUINFO_SPR))
    v = _kd_verdict(avx2, amx, factor=0.62)
    assert v.verdict == "not comparable"
    assert "bf16/fp32 matmul 4.33 vs 0.104" in v.reason and "weighs them differently" in v.reason
    same_ratios = probe("AVX512", fp32=160.0, bf16=16.0, triad=30.0 * 160.0 / 71.2, flags=CPUINFO_SPR)
    assert _kd_verdict(avx2, env_with(same_ratios),
                       factor=0.62).verdict == "regression"   # another box, the same bf16/fp32 ratio and balance: judged
    assert _verdicts(amx, avx2, metric="matmul_eff_pct")[0].verdict == "regression"   # one dtype: judged


def test_a_run_is_judged_by_the_matmul_rates_it_computes_in():
    """CI on a 2-core AMX VM: one core's bf16 F.linear read 441 and 932 GFLOP/s on two nights (its host's
    neighbours; fp32 stayed within 10 %), and every verdict of the second night, fp32 runs and
    collectives alike, read "not comparable" by bf16 alone, so the slower link went unseen. A run is
    judged where the rates it rests on agree: an fp32 run's fp32 matmul, a bf16 run's bf16, a
    distillation's both, a collective's none (the ISA and the triad always); a run that does not say
    (it failed), by every rate."""
    from harness.verdict.compare import Group, run_dtypes

    amx = {"isa": "AVX512", "flags": CPUINFO_SPR, "fp32": 100.0}
    ref, now = env_with(probe(**amx, bf16=932.0)), env_with(probe(**amx, bf16=441.0))

    def verdict(dtypes: list[str] | None):
        runs = [record(i, env=now, samples_per_s=(v * 0.5, "samples/s"), matmul_eff_pct=(20.0, "%"))
                for i, v in enumerate([100.0, 99.5, 100.5])]
        for r in runs:
            if dtypes is None:
                del r["metrics"]["matmul_eff_pct"]
            else:
                r["metrics"]["matmul_eff_pct"]["measured_gflops"] = {d: 200.0 for d in dtypes}
        (v,) = [v for v in compare(typed(runs), [reference([100.0, 101.0, 99.0], env=ref)]) if v.metric == "samples_per_s"]
        return v

    assert verdict(["fp32"]).verdict == "regression"
    for dtypes in (["bf16"], ["fp32", "bf16"], None):
        v = verdict(dtypes)
        assert v.verdict == "not comparable" and "bf16 matmul 441 vs 932 GFLOP/s per core" in v.reason, (dtypes, v.reason)
    assert run_dtypes(Group("cpu-cluster", "all_reduce", "collective", {}, [])) == []
    assert not_comparable(ref, now, []) is None and not_comparable(ref, now) is not None
    slower_memory = env_with(probe(**amx, bf16=441.0, triad=10.0))
    assert not_comparable(ref, slower_memory, []) == "not comparable: memory bandwidth (triad) 10 vs 30 GB/s"
    assert "ISA AVX2 vs AVX512" in not_comparable(ref, env_with(probe()), [])


def test_what_changed_names_the_machine_first_and_the_suite_commit_last():
    ref = {**env_with(probe()), "torch": "2.12.0", "suite_commit": "aaaa"}
    cur = {**env_with(probe("DEFAULT", triad=10.0)), "torch": "2.13.0", "suite_commit": "bbbb"}
    keys = list(environment_diff(ref, cur))
    assert keys[:2] == ["probe.isa", "probe.triad_gbps"] and keys[-1] == "suite_commit" and "torch" in keys
    assert probe_diff(ref, cur)["probe.isa"] == ["AVX2", "DEFAULT"]


def test_capacity_counts_the_cores_the_ranks_can_use_and_gpus_per_node():
    assert capacity_gflops([probe()], "fp32", ranks_per_node=2, threads_per_rank=1) == pytest.approx(160.0)
    assert capacity_gflops([probe()], "fp32", ranks_per_node=2, threads_per_rank=16) == pytest.approx(160.0)
    gpu = {**probe(), "device": "cuda"}
    assert capacity_gflops([gpu, gpu], "bf16", ranks_per_node=8, threads_per_rank=1) == pytest.approx(2 * 8 * 1.2)
    assert capacity_gflops([probe()], "fp16", 2, 1) is None


def test_the_summary_line_says_the_isa_rates_and_time():
    line = summary_line(env_with(probe()))
    assert line == ("probe (vm, 3.3 s a node): AVX2; matmul fp32 80, bf16 1.2 GFLOP/s per core (spread 3 %, 2 %); "
                    "triad 30 GB/s")
    assert summary_line(env_with(None)) is None and summary_line(env_with({"error": "boom"})) is None
    hosted = {**probe(), "host_dispatch": {"best": 0.862, "median": 0.85, "spread_pct": 1.4, "unit": "Mop/s"}}
    assert summary_line(env_with(hosted)).endswith("; triad 30 GB/s; host dispatch 0.86 Mop/s")


def test_the_probe_measures_the_hosts_pace_at_issuing_work():
    """host_dispatch: million torch ops a second on one thread, what a host-bound GPU step moves with (the
    two one-GPU nodes' ZeRO-1 mb-8 forward phases, 38.1 and 23.5 ms, had no figure that told their hosts
    apart). A "what changed" names it where it moved beyond HOST_DISPATCH_PCT; it never parts two machines,
    and it is pooled over a night's probes like the other figures."""
    from benchmarks.node.probe import host_dispatch
    from harness.probe import HOST_DISPATCH_PCT, pooled
    fig = host_dispatch()
    assert fig["unit"] == "Mop/s" and fig["repeats"] == 5 and 0.01 < fig["best"] < 100 and fig["median"] <= fig["best"]
    fast, slow = ({**probe(), "host_dispatch": {"best": x, "median": x, "unit": "Mop/s"}} for x in (0.86, 0.60))
    assert probe_diff(env_with(fast), env_with(slow))["probe.host_dispatch_mops"] == [0.86, 0.60]
    near = {**probe(), "host_dispatch": {"best": 0.86 * (1 - HOST_DISPATCH_PCT / 200), "unit": "Mop/s"}}
    assert "probe.host_dispatch_mops" not in probe_diff(env_with(fast), env_with(near))
    assert differences(fast, slow) == [] and not_comparable(env_with(fast), env_with(slow)) is None
    night = pooled(env_with(slow), [env_with(slow), env_with(fast)])
    assert night["machine"]["probe"]["host_dispatch"]["best"] == 0.86


def test_the_efficiency_weighs_each_part_by_its_own_dtype_rate():
    # 1 GFLOP a token of fp32 training at 2 x 80 GFLOP/s, plus 0.1 GFLOP of a bf16 teacher at 2 x 1.2
    eff, inputs = efficiency_pct(10.0, [(1e9, "fp32"), (1e8, "bf16")], [probe()], 2, 1)
    assert eff == pytest.approx(100 * 10.0 * (1e9 / 160e9 + 1e8 / 2.4e9))
    assert inputs["measured_gflops"] == {"fp32": 160.0, "bf16": 2.4}
    assert efficiency_pct(10.0, [(1e9, "fp16")], [probe()], 2, 1) is None


def test_a_box_the_references_cannot_judge_is_judged_against_its_own_first_bench(tmp_path):
    """Issue 26 item 4: on another box the shipped references are not comparable, their efficiency
    is judged across machines, and the second bench is judged against this box's first."""
    from harness.verdict.baseline import judge
    from unit_helpers import schema_valid

    fast = env_with(probe("AVX512", fp32=160.0, bf16=79.0, flags=CPUINFO_SPR))
    refs = [reference([100.0, 101.0, 99.0], env=fast),
            reference([50.0, 51.0, 49.0], env=fast, metric="matmul_eff_pct", unit="%")]
    results = []
    for n in (1, 2):
        out = tmp_path / f"bench{n}"
        out.mkdir()
        rec = schema_valid(record(n, env=env_with(probe()), samples_per_s=(40.0, "samples/s"),
                                  matmul_eff_pct=(50.0, "%")))
        rec["created_utc"] = f"2026-11-2{n}T10:00:00+00:00"
        verdicts = compare(typed([rec]), refs)
        assert {v.metric: v.verdict for v in verdicts if v.metric in ("samples_per_s", "matmul_eff_pct")} == \
            {"samples_per_s": "not comparable", "matmul_eff_pct": "pass"}
        results.append(judge(typed([rec]), verdicts, "auto", out))
    assert results[0].unjudged == 1 and results[0].verdicts == []
    assert {v.metric: v.verdict for v in results[1].verdicts}["samples_per_s"] == "pass"


def paced_env(fp32_pulse: float | None, fp32_probe: float = 78.0, triad_pulse: float | None = None) -> dict:
    env = env_with(probe(fp32=fp32_probe))
    env["load"] = {"other_cpus": 0.0, "pulse_fp32": fp32_pulse,
                   **({"pulse_triad": triad_pulse} if triad_pulse is not None else {})}
    return env


def test_a_run_the_machine_slowed_is_not_comparable_with_the_pace_in_words():
    """The bench's probe called the machine comparable (78 vs 80), but the machine ran 40 % slower
    during this run (its pulse 48 against the reference's 80): the 40 % fewer samples/s are the
    machine's, not the software's."""
    (v,) = _verdicts(env_with(probe()), paced_env(48.0), factor=0.6)
    assert v.verdict == "not comparable"
    assert v.reason.startswith("not comparable: the machine ran 40 % slower during this run than the reference's "
                               "(fp32 matmul 48 vs 80 GFLOP/s per core, this run's pulse); at its own pace the "
                               "regression is a change of ")
    assert "within the tolerance 5 %" in v.reason


def test_a_regression_beyond_the_machines_pace_stays_a_regression():
    assert [v.verdict for v in _verdicts(env_with(probe()), paced_env(48.0), factor=0.4)] == ["regression"]
    # a pulse within its noise of the reference's pace explains nothing
    assert [v.verdict for v in _verdicts(env_with(probe()), paced_env(76.0), factor=0.6)] == ["regression"]
    # a run without a pulse (a record from before) is judged as before
    assert [v.verdict for v in _verdicts(env_with(probe()), paced_env(None), factor=0.6)] == ["regression"]


def test_a_run_whose_machine_lost_memory_bandwidth_is_not_comparable_with_both_paces_in_words():
    """CI on the 2-core AVX2 EPYC: the triad read 13.1 against the references' 18.4 GB/s while the fp32 pulse
    read 81 against 71, and ZeRO-1 ran 0.59x their samples/s, a regression the matmul pace could not explain.
    With the memory pulse, a step at the same software runs between its two paces (all matmuls: 1x here,
    the fp32 pace within its noise; all memory traffic: the triad's 0.55x)."""
    ref = env_with(probe())                               # triad 30 GB/s, fp32 80, no pulse of its own
    (v,) = _verdicts(ref, paced_env(79.0, triad_pulse=16.5), factor=0.6)
    assert v.verdict == "not comparable"
    assert v.reason.startswith("not comparable: the machine's memory ran 45 % slower during this run than the "
                               "reference's (fp32 matmul 79 vs 80 GFLOP/s per core, memory bandwidth (triad) 16.5 vs "
                               "30 GB/s: this run's pulses); at its own pace the regression is a change of +0.0 %")
    assert pace(ref, paced_env(79.0, triad_pulse=16.5)).memory == (16.5, 30.0)
    # beyond the range (0.4x against the triad's 0.55x, tolerance 5 %): a regression
    assert [v.verdict for v in _verdicts(ref, paced_env(79.0, triad_pulse=16.5), factor=0.4)] == ["regression"]
    # a memory pace within its noise (25 % on cpu) explains nothing
    assert [v.verdict for v in _verdicts(ref, paced_env(79.0, triad_pulse=24.0), factor=0.6)] == ["regression"]
    # the reference's own memory pulse is preferred to its probe's: against its 20 GB/s, 16.5 is within the noise
    ref["load"] = {"pulse_fp32": 80.0, "pulse_triad": 20.0}
    assert [v.verdict for v in _verdicts(ref, paced_env(79.0, triad_pulse=16.5), factor=0.6)] == ["regression"]
    # the matmul pace slower (0.70x), the memory's as the reference's: a step runs between 0.70x and 1x
    (v,) = _verdicts(ref, paced_env(56.0, triad_pulse=19.0), factor=0.75)
    assert v.verdict == "not comparable" and v.reason.startswith("not comparable: the machine ran 30 % slower")


def test_an_efficiency_moves_with_the_machine_s_pace_against_its_own_probe():
    """matmul_eff_pct is model FLOP/s over the rate the bench's probe read before its first run: a machine that
    slowed after its probe (the pulse 48 against its probe's 80) reads 0.6x the efficiency at the same software,
    while its samples/s row is the pace's to explain. A probe that read the machine slow too is judged as is."""
    from harness.pace import probe_pace

    slowed = paced_env(48.0, fp32_probe=80.0)
    (v,) = _verdicts(env_with(probe()), slowed, factor=0.6, metric="matmul_eff_pct")
    assert v.verdict == "not comparable"
    assert v.reason.startswith("not comparable: the machine ran 40 % slower during this run than the reference's (fp32 "
                               "matmul 0.60x vs 1.00x of its bench's probe, which the efficiency is measured against")
    assert probe_pace(env_with(probe()), slowed)[:2] == (0.6, 1.0)
    probed_slow = paced_env(48.0, fp32_probe=48.0)   # its probe read 48 too: the efficiency is against that rate
    assert [v.verdict for v in _verdicts(env_with(probe()), probed_slow, factor=0.6, metric="matmul_eff_pct")] \
        == ["regression"]


def test_a_faster_machine_makes_no_improvement_and_the_reference_pulse_is_preferred():
    (v,) = _verdicts(env_with(probe()), paced_env(120.0), factor=1.5)
    assert v.verdict == "not comparable" and "ran 50 % faster" in v.reason
    ref = env_with(probe())
    ref["load"] = {"pulse_fp32": 60.0}           # the reference's own pulse, not its probe's 80
    assert pace(ref, paced_env(48.0)) == (48.0, 60.0, "GFLOP/s per core", "cpu", None, "")   # no memory pulse: None
    assert pace(env_with(probe()), paced_env(48.0))[1] == 80.0
    assert pace(env_with(None), paced_env(48.0)) is None


def test_an_apparent_change_the_machines_pace_explains_is_not_comparable_rather_than_insufficient_data():
    """Found in a real `make nightly` on cpu: on a box 33 % faster than the references', ZeRO-2's
    samples/s read "not comparable: the machine ran 33 % faster", while ZeRO-1's at 1.27x, whose interval
    straddled the tolerance, read "insufficient data", its cause unsaid."""
    ref = reference([100.0, 101.0, 99.0], env=env_with(probe()))
    runs = [record(i, env=paced_env(96.0), samples_per_s=(v, "samples/s")) for i, v in enumerate([95.0, 120.0, 125.0])]
    (v,) = [v for v in compare(typed(runs), [ref]) if v.metric == "samples_per_s"]
    assert v.verdict == "not comparable"
    assert ("ran 20 % faster" in v.reason and "at its own pace the apparent improvement is a change of +0.0 %"
            in v.reason)
    unexplained = [record(i, env=paced_env(80.0), samples_per_s=(x, "samples/s"))
                   for i, x in enumerate([95.0, 120.0, 125.0])]   # at the reference's pace: as before
    assert [v.verdict for v in compare(typed(unexplained), [ref]) if v.metric == "samples_per_s"] == ["insufficient data"]


def test_only_what_moves_with_the_machines_speed_is_paced():
    assert {m for m, spec in METRICS.items() if spec.paced} == {
        "samples_per_s", "tokens_per_s", "step_time_s", "mfu_pct", "mfu_with_teacher_pct", "tokens_per_s_per_device",
        "profile_step_time_s", "comm_time_s", "compile_s"}
    ref = reference([1.0, 1.0, 1.0], env=env_with(probe()), metric="peak_mem_gib", unit="GiB", direction="lower")
    runs = [record(i, env=paced_env(48.0), peak_mem_gib=(2.0, "GiB")) for i in range(3)]
    (v,) = [v for v in compare(typed(runs), [ref]) if v.metric == "peak_mem_gib"]
    assert v.verdict == "regression"            # memory does not move with the machine's pace


def test_a_pulse_reads_this_machines_fp32_pace_and_never_fails():
    figure = pulse("cpu")
    assert isinstance(figure, float) and figure > 0
    assert pulse("no-such-device") is None


def _probe_as(host: str, out_dir: str, spans) -> None:
    """One emulated node (its own host name, this machine's boot id) probing into the bench's folder;
    measure() is a stand-in that records when it ran."""
    socket.gethostname = lambda: host

    def measure(device: str) -> dict:
        t0 = time.monotonic()
        time.sleep(0.4)
        spans.append((host, t0, time.monotonic()))
        return {"schema_version": "1", "host": host, "device": device, "matmul": {}}

    probe_module.measure = measure
    node_probe(Path(out_dir), "cpu", first_on_node=True)


def test_nodes_of_one_machine_probe_one_after_the_other(tmp_path):
    """The emulated cluster's nodes share the box: probed at once, each one-core triad read about half
    of what it reads alone (26 vs 49 GB/s measured), so a night's machine "changed" by chance. The
    nodes of one boot id take turns; each says how long it waited."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Manager() as manager:
        spans = manager.list()
        procs = [ctx.Process(target=_probe_as, args=(host, str(tmp_path), spans)) for host in ("node1", "node2")]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(30)
        (a0, a1), (b0, b1) = sorted((s, e) for _, s, e in spans)
    assert all(proc.exitcode == 0 for proc in procs)
    assert b0 >= a1, "the two nodes' probes overlapped"
    waited = sorted(json.loads((tmp_path / "probes" / f"{h}.json").read_text())["waited_for_machine_s"]
                    for h in ("node1", "node2"))
    assert waited[0] < 0.2 and waited[1] > 0   # the second waited for the first; how long depends on when the
    # fork let it start (0.27 s in a clean-clone CI whose other phase loaded the box): no bound on time here


class _Box:
    """A stand-in machine for probe.quiet: each attempt at a figure takes a second, during which other
    work took `others[i]` CPUs' worth (None: /proc/stat unreadable) and the hypervisor `steals[i]`."""

    def __init__(self, others: list, steals: list | None = None) -> None:
        self.others, self.t, self.busy, self.own, self.calls = list(others), 0.0, 0.0, 0.0, 0
        self.steals, self.steal = list(steals or [0.0] * len(others)), 0.0

    def figure(self) -> dict:
        other, steal = self.others[self.calls], self.steals[self.calls]
        self.calls += 1
        self.t += 1.0
        self.own += 1.0
        self.busy = None if other is None else (self.busy or 0.0) + 1.0 + other
        self.steal = None if other is None else (self.steal or 0.0) + steal
        return {"best": 100.0 - 10 * self.calls}


def _quiet(monkeypatch, others: list, wait_s: float = 8.0, steals: list | None = None) -> tuple[dict, _Box]:
    box = _Box(others, steals)
    monkeypatch.setattr(probe_module, "time", type("clock", (), {"monotonic": staticmethod(lambda: box.t)}))
    monkeypatch.setattr(probe_module, "busy_cpu_s", lambda: box.busy)
    monkeypatch.setattr(probe_module, "steal_cpu_s", lambda: box.steal)
    monkeypatch.setattr(probe_module, "own_cpu_s", lambda: box.own)
    return probe_module.quiet(box.figure, deadline=wait_s), box


def test_a_figure_measured_while_other_work_ran_is_measured_again_until_quiet(monkeypatch):
    """On the emulated cluster a node probed while the other node's rank was still importing read bf16
    5.33 against 9.17 GFLOP/s, and the next night judged nothing: such a figure is measured again."""
    figure, box = _quiet(monkeypatch, [1.0, 0.6, 0.1, 0.0])
    assert box.calls == 3 and figure == {"best": 70.0, "other_cpus": 0.1, "steal_cpus": 0.0, "attempts": 3}


def test_a_figure_measured_while_the_hypervisor_took_the_cpus_is_measured_again(monkeypatch):
    """No other process ran, but the hypervisor took 0.6 CPUs' worth (steal): the figure is as slowed."""
    figure, box = _quiet(monkeypatch, [0.0, 0.1, 0.0], steals=[0.6, 0.3, 0.05])
    assert box.calls == 3 and figure == {"best": 70.0, "other_cpus": 0.0, "steal_cpus": 0.05, "attempts": 3}


def test_a_box_that_stays_busy_keeps_the_quietest_attempt_when_the_time_is_up(monkeypatch):
    figure, box = _quiet(monkeypatch, [0.9, 0.5, 0.7, 0.8, 0.4], wait_s=3.0)
    assert box.calls == 3 and figure == {"best": 80.0, "other_cpus": 0.5, "steal_cpus": 0.0, "attempts": 3}


def test_a_machine_whose_load_cannot_be_read_is_measured_once(monkeypatch):
    figure, box = _quiet(monkeypatch, [None, 0.0])
    assert box.calls == 1 and figure == {"best": 90.0, "other_cpus": None, "steal_cpus": None, "attempts": 1}


def test_a_groups_probes_are_pooled_so_one_runs_dip_does_not_part_the_machine():
    """CI, the cpu nightly: night 2's second run probed fp32 matmul 45.3 GFLOP/s, quiet (its first run
    80.6, the runs' pulses 72-77), and judged by that probe alone every verdict read "not comparable".
    A group's verdict reads the best of its runs' probes of each node; a reference over several runs
    too; another node's (or another boot's) probe is never pooled in."""
    from harness.probe import pooled

    first, dipped = env_with(probe(fp32=80.6, bf16=7.9)), env_with(probe(fp32=45.3, bf16=8.5))
    ref = env_with(probe(fp32=78.2, bf16=8.0))
    assert differences(probe(fp32=78.2), probe(fp32=45.3))                 # one probe alone parts them
    both = pooled(dipped, [first, dipped])
    assert both["machine"]["probe"]["matmul"]["fp32"]["best"] == 80.6 and both["machine"]["probe"]["matmul"]["bf16"]["best"] == 8.5
    assert dipped["machine"]["probe"]["matmul"]["fp32"]["best"] == 45.3     # the record itself is untouched
    assert not_comparable(ref, both) is None
    elsewhere = env_with(probe(fp32=80.6, host="other"))
    assert pooled(dipped, [elsewhere, dipped])["machine"]["probe"]["matmul"]["fp32"]["best"] == 45.3
    assert pooled(dipped, [dipped]) is dipped
    runs = [record(i, env=e) for i, e in enumerate([first, dipped])]
    (v,) = [v for v in compare(typed(runs), [reference([100.0, 101.0, 99.0], env=ref)]) if v.metric == "samples_per_s"]
    assert v.verdict != "not comparable", v.reason
