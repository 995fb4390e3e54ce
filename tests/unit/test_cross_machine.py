"""Pairing across machines (issue 39 item 2): runs of one configuration on two machines pair whatever
the platforms are called. Throughput and times are "not comparable", the two machines named and the
ratio shown as information; the efficiency against each machine's own measured matmul rate is judged
across them; one line sums the pair up (geometric mean, ranking). Real records: an H100's gpu-check
against an H200's (reference_results/sources/gpu-runs), and a real cpu record made into an AVX-512
box's by editing its probe."""
from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.verdict.ab import against
from harness.verdict.compare import compare, load_records
from harness.verdict.cross_machine import geomean, machine_pairs
from harness.verdict.references import load_references
from unit_helpers import REPO_ROOT

GPU_RUNS = REPO_ROOT / "reference_results" / "sources" / "gpu-runs"
H100 = GPU_RUNS / "2026-11-27-h100" / "gpu-check"
H200 = GPU_RUNS / "2026-11-26-h200" / "gpu-check"
CPU_RECORD = REPO_ROOT / "tests" / "data" / "attribution" / "old-llama-tiny.json"
TRAINING = ["01-z0.json", "02-z1.json", "03-z2.json", "04-z3.json"]
SPEED = ("samples_per_s", "tokens_per_s", "step_time_s", "mfu_pct", "peak_mem_gib")


def copied(src: Path, dest: Path, names: list[str] = TRAINING) -> str:
    dest.mkdir(parents=True)
    for name in names:
        shutil.copy(src / name, dest / name)
    return str(dest)


def values(folder: Path, metric: str) -> list[float]:
    return [json.loads((folder / n).read_text())["metrics"][metric]["value"] for n in TRAINING]


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["compare", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def sides(tmp_path):
    return copied(H100, tmp_path / "h100"), copied(H200, tmp_path / "h200")


def test_an_h100_gpu_check_pairs_with_an_h200_one(sides, capsys):
    h100, h200 = sides
    verdicts, left = against([h100], [h200])
    assert left == "" and not [v for v in verdicts if v.verdict == "new"], "every configuration has its counterpart"
    assert {v.reference_platform for v in verdicts} == {"h200"} and {v.platform for v in verdicts} == {"h100"}
    assert len({json.dumps(v.config, sort_keys=True) for v in verdicts}) == 4
    for v in verdicts:
        assert v.machines == ["H100 80GB HBM3", "H200"]
        if v.metric in SPEED:    # no verdict on speed across machines: the ratio is information
            assert v.verdict == "not comparable" and v.reason.startswith("not comparable: H100 80GB HBM3 vs H200")
            assert "memory bandwidth (triad) 3,030 vs 4,292 GB/s" in v.reason
            assert v.worse_pct is not None and v.interval_pct is None
        elif v.config["zero_stage"] < 3:   # the efficiency, 0.87-0.88x: within what the two GPUs' balance allows
            assert v.metric == "matmul_eff_pct" and v.verdict == "not comparable"
            assert v.reason.startswith("not comparable: the machines' balance differs (bf16 matmul per byte of memory "
                                       "bandwidth (triad) 256 vs 177 FLOP/B)")
            assert v.reason.endswith("; the machines apart: H100 80GB HBM3 vs H200: memory bandwidth (triad) 3,030 "
                                     "vs 4,292 GB/s"), v.reason   # what sets them apart, as every verdict across
            assert v.balance["now"] == pytest.approx(774317.247 / 3030.012) and v.balance["dtype"] == "bf16"
            assert v.balance["reference"] == pytest.approx(759656.837 / 4292.061)
        else:                              # ZeRO-3's 1.16x lies above it: host-bound, another host
            assert v.metric == "matmul_eff_pct"
            assert v.verdict == "insufficient data" and v.reason.startswith("across machines (H100 80GB HBM3 vs H200")
    z0 = next(v for v in verdicts if v.metric == "samples_per_s" and v.config["zero_stage"] == 0)
    assert z0.value / z0.reference == pytest.approx(709.086 / 786.900, rel=1e-4)   # 0.90x

    rc, out, _ = run(capsys, h100, "--against", h200)
    assert rc == 0 and "no counterpart" not in out and "\nnew " not in out
    assert "not comparable     c1   samples_per_s   709.086   786.900   0.901x (1.11x slower)" in out
    now, then = values(H100, "samples_per_s"), values(H200, "samples_per_s")
    speed = math.prod(a / b for a, b in zip(now, then)) ** 0.25
    assert f"H100 80GB HBM3 runs these 4 configurations at {speed:.3f}x the H200's samples/s" in out
    eff = math.prod(a / b for a, b in zip(values(H100, "matmul_eff_pct"), values(H200, "matmul_eff_pct"))) ** 0.25
    assert f"at {eff:.3f}x of its efficiency (matmul_eff_pct, 4 configurations" in out
    low = (759656.837 / 4292.061) / (774317.247 / 3030.012)
    assert (f"their balance (bf16 matmul per byte of memory bandwidth) puts the same software between {low:.2f}x (a step "
            "all memory traffic) and 1x (all matmuls), 3 configurations within that") in " ".join(out.split())
    # ZeRO-0 is ahead of ZeRO-2 on the H100 (709 against 706 samples/s), behind it on the H200 (787 against 792):
    # on one GPU neither communicates, and 0.4 % and 0.6 % are within a GPU run's noise, a tie on both machines
    assert now[0] > now[2] and then[0] < then[2]
    assert ("ranking of the configurations by samples/s unchanged beyond noise: c1 and c3 tied (c1 0.4 % ahead on "
            "H100 80GB HBM3, c3 0.6 % on H200), within a run's noise (3 %)") in " ".join(out.split())
    assert "changed:" not in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 120


def edited(folder: str, edit) -> None:
    """Each training record of `folder` through edit(record), in place."""
    for name in TRAINING:
        path = Path(folder) / name
        record = json.loads(path.read_text())
        edit(record)
        path.write_text(json.dumps(record))


def test_the_efficiency_gets_a_real_verdict_across_the_two_machines(sides):
    verdicts, _ = against([sides[0]], [sides[1]], min_samples=1)
    eff = {v.config["zero_stage"]: v.verdict for v in verdicts if v.metric == "matmul_eff_pct"}
    # 0.88x of the H200's efficiency under ZeRO 0-2 (tolerance 10 %): within [0.69x, 1x], what an H100's 0.71x
    # of the H200's triad at the same matmul rate allows; 1.16x under ZeRO-3, above 1x: judged
    assert eff == {0: "not comparable", 1: "not comparable", 2: "not comparable", 3: "improvement"}
    assert {v.verdict for v in verdicts if v.metric in SPEED} == {"not comparable"}


def test_an_efficiency_beyond_the_balance_or_between_balanced_machines_stays_a_regression(sides):
    h100, h200 = sides

    def triad(record, gbps):   # the H100's memory bandwidth as the H200's: the same balance
        for machine in [record["environment"]["machine"]] + [n["machine"] for n in record["environment"].get("nodes") or []]:
            machine["probe"]["triad"]["best"] = gbps

    edited(h100, lambda r: triad(r, 4292.061))
    verdicts, _ = against([h100], [h200], min_samples=1)
    eff = {v.config["zero_stage"]: v for v in verdicts if v.metric == "matmul_eff_pct"}
    assert [eff[s].verdict for s in range(4)] == ["regression", "regression", "regression", "improvement"]
    assert all(v.balance["now"] == pytest.approx(v.balance["reference"], rel=0.03) for v in eff.values())

    def slower(record):        # the triad back, and the efficiency at 0.6x the H200's: below 0.69x by more than 10 %
        triad(record, 3030.012)
        record["metrics"]["matmul_eff_pct"]["value"] *= 0.6 / 0.88
    edited(h100, slower)
    verdicts, _ = against([h100], [h200], min_samples=1)
    eff = {v.config["zero_stage"]: v for v in verdicts if v.metric == "matmul_eff_pct"}
    assert [eff[s].verdict for s in range(3)] == ["regression"] * 3
    assert eff[0].balance and eff[0].reason.startswith("across machines (")


def test_the_json_carries_the_machines_the_ratio_and_the_pair(sides, capsys):
    rc, out, _ = run(capsys, sides[0], "--against", sides[1], "--json")
    rows = json.loads(out)
    assert rc == 0 and len(rows) == 24
    row = next(r for r in rows if r["metric"] == "samples_per_s" and r["config"]["zero_stage"] == 0)
    assert row["verdict"] == "not comparable" and row["machines"] == ["H100 80GB HBM3", "H200"]
    assert row["ratio"] == pytest.approx(709.086 / 786.900, rel=1e-4) and row["change"].startswith("0.901x")
    pair = row["across_machines"]
    assert pair["now"] == "H100 80GB HBM3" and pair["reference"] == "H200" and pair["num_configurations"] == 4
    assert pair["speed_ratio_geomean"] == pytest.approx(geomean([r["ratio"] for r in rows if r["metric"] == "samples_per_s"]))
    assert set(pair["efficiency_ratio_geomean"]) == {"matmul_eff_pct"} and pair["ranking_unchanged"] is True
    bound = pair["efficiency_memory_bound"]["matmul_eff_pct"]
    assert bound["dtype"] == "bf16" and bound["explained"] == 3
    assert bound["ratio"] == pytest.approx((759656.837 / 4292.061) / (774317.247 / 3030.012))
    z0 = next(r for r in rows if r["metric"] == "matmul_eff_pct" and r["config"]["zero_stage"] == 0)
    assert z0["verdict"] == "not comparable" and z0["balance"]["dtype"] == "bf16" and z0["change"].startswith("0.88x")
    assert pair["swapped"] == [] and pair["noise_pct"] == 3.0
    (swap,) = pair["tied"]
    assert (swap["ahead_now"].split()[1], swap["ahead_on_reference"].split()[1]) == ("ZeRO-0", "ZeRO-2")
    assert swap["gaps_pct"] == pytest.approx([100 * (709.086 / 705.953 - 1), 100 * (791.584 / 786.900 - 1)], rel=1e-3)
    assert all(r["across_machines"] == pair for r in rows)


def test_a_reference_table_of_another_platform_judges_too():
    verdicts = compare(load_records([str(H100)]), load_references([REPO_ROOT / "reference_results" / "h200.json"]))
    judged = [v for v in verdicts if v.run_ids]
    assert len(judged) == 24 and {v.reference_platform for v in judged} == {"h200"}
    assert {v.verdict for v in judged if v.metric in SPEED} == {"not comparable"}
    assert not [v for v in verdicts if v.verdict == "missing" and v.run_ids], "nothing of the h200 table is missing"
    (pair,) = machine_pairs(judged, ("matmul_eff_pct",))
    assert (pair.now, pair.reference, pair.num_configs) == ("H100 80GB HBM3", "H200", 4)
    # beside the H100's own table (made from these very records), the own platform's references judge
    tables = [REPO_ROOT / "reference_results" / f"{p}.json" for p in ("h100", "h200")]
    own = [v for v in compare(load_records([str(H100)]), load_references(tables)) if v.run_ids]
    assert {v.reference_platform for v in own} == {None} and {v.verdict for v in own} == {"pass"}


def test_the_same_platform_pairs_first_and_the_other_is_left_over(tmp_path):
    h100 = copied(H100, tmp_path / "h100")
    old = [copied(H100, tmp_path / "old"), copied(H200, tmp_path / "h200")]
    verdicts, left = against([h100], old)
    assert {v.verdict for v in verdicts} == {"pass"}, "a machine against itself: the same records pass"
    assert {v.reference_platform for v in verdicts} == {None} and {str(v.machines) for v in verdicts} == {"None"}
    assert left.startswith("4 results of --against with no counterpart in NEW: h200/llama-440m ZeRO-0")


def test_one_machine_against_itself_reads_as_before(tmp_path, capsys):
    same = copied(H200, tmp_path / "again", sorted(p.name for p in H200.glob("0*.json")))   # collectives too
    rc, out, _ = run(capsys, same, "--against", str(H200))
    assert rc == 0 and "runs these" not in out and "not comparable" not in out and "no counterpart" not in out


def test_bad_input_still_stops_with_a_message(sides, capsys):
    rc, out, err = run(capsys, sides[0], "--against", str(Path(sides[1]).parent / "nowhere"))
    assert rc == 2 and out == "" and err.startswith("error: --against: ") and "no such file or folder" in err


# --- cpu boxes of two ISA classes (a real AVX2 record, edited into an AVX-512 box's) --------------------

def cpu_record(run_id: str, stage: int, speed: float, *, avx512: bool = False, platform: str = "cpu",
               triad: float = 2.0) -> dict:
    """The real cpu record at ZeRO `stage`, its throughput times `speed`; avx512: on a box whose probe
    reads AVX-512 with BF16 and AMX, its fp32 matmul 2x the AVX2 box's (efficiency against that rate),
    its triad `triad` x (2x: the same balance of matmul rate and memory bandwidth)."""
    r = copy.deepcopy(json.loads(CPU_RECORD.read_text()))
    r["run_id"], r["platform"] = run_id, platform
    r["config"]["zero"]["stage"] = stage
    r["config"]["platform"]["name"] = platform
    m = r["metrics"]
    for name in ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "mfu_pct"):
        m[name]["value"] *= speed
    m["step_time_s"]["value"] /= speed
    m["matmul_eff_pct"]["value"] *= speed / (2.0 if avx512 else 1.0)
    if avx512:
        env = r["environment"]
        machines = [env["machine"]] + [n["machine"] for n in env.get("nodes") or []]
        for machine in machines:
            machine["cpu"]["model"] = "Intel(R) Xeon(R) Platinum 8480+"
            probe = machine["probe"]
            probe["isa"].update({"torch_cpu_capability": "AVX512", "class": "AVX512 +avx512_bf16 +amx_bf16"})
            probe["isa"]["flags"].update({"avx512f": True, "avx512_bf16": True, "amx_bf16": True, "amx_tile": True})
            probe["matmul"]["fp32"]["best"] *= 2.0
            probe["matmul"]["bf16"]["best"] *= 50.0
            probe["triad"]["best"] *= triad
        m["matmul_eff_pct"]["measured_gflops"] = {"fp32": m["matmul_eff_pct"]["measured_gflops"]["fp32"] * 2.0}
    return r


def write(folder: Path, records: list[dict]) -> str:
    folder.mkdir(parents=True)
    for r in records:
        (folder / f"{r['run_id']}.json").write_text(json.dumps(r), encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize("platform", ["cpu", "cpu-avx512"], ids=["one platform name", "two platform names"])
def test_cpu_boxes_of_two_isa_classes_pair_the_same_way(tmp_path, capsys, platform):
    # the AVX-512 box runs ZeRO-1 1.8x as fast (0.9x of the AVX2 box's efficiency: its fp32 matmul is 2x),
    # ZeRO-2 as fast as the AVX2 box (0.5x of its efficiency: beyond the 35 % tolerance)
    old = write(tmp_path / "avx2", [cpu_record(f"a{s}-{i}", s, f) for s, f in ((1, 1.0), (2, 0.9)) for i in range(2)])
    new = write(tmp_path / "avx512", [cpu_record(f"b{s}-{i}", s, f, avx512=True, platform=platform)
                                      for s, f in ((1, 1.8), (2, 0.9)) for i in range(2)])
    verdicts, left = against([new], [old])
    assert left == "" and not [v for v in verdicts if v.verdict == "new"]
    machines = ("Intel Xeon Platinum 8480+ (2 CPUs, AVX512 +avx512_bf16 +amx_bf16)", "AMD EPYC (2 CPUs, AVX2)")
    assert {tuple(v.machines) for v in verdicts} == {machines}
    assert {v.reference_platform for v in verdicts} == ({None} if platform == "cpu" else {"cpu"})
    speed = {v.config["zero_stage"]: v for v in verdicts if v.metric == "samples_per_s"}
    assert {v.verdict for v in speed.values()} == {"not comparable"}
    assert "(ISA AVX512 +avx512_bf16 +amx_bf16 vs AVX2)" in speed[1].reason
    assert speed[1].value / speed[1].reference == pytest.approx(1.8)
    assert speed[2].value / speed[2].reference == pytest.approx(1.0)
    eff = {v.config["zero_stage"]: v for v in verdicts if v.metric == "matmul_eff_pct"}
    assert (eff[1].verdict, eff[2].verdict) == ("pass", "regression")
    assert all(v.reason.startswith("across machines (") for v in eff.values())
    rc, out, _ = run(capsys, new, "--against", old)
    assert rc == 1, "an efficiency regression across machines fails as any regression"
    assert (f"runs these 2 configurations at {math.sqrt(1.8):.2f}x the AMD EPYC (2 CPUs, AVX2)'s samples/s "
            "(geometric mean of now/OLD over the configurations, 1.000x-1.800x)") in " ".join(out.split())
    assert f"at {math.sqrt(0.9 * 0.5):.2f}x of its efficiency (matmul_eff_pct, 2 configurations" in out
    assert "ranking of the configurations by samples/s unchanged" in out


def test_an_efficiency_change_between_cpu_boxes_of_another_balance_is_judged_beyond_what_it_allows(tmp_path, capsys):
    # the AMX box's fp32 matmul 2x the AVX2 box's, its triad the same: at the same software a step reads between
    # 0.5x (all memory traffic) and 1x (all matmuls) of the AVX2 box's efficiency
    old = write(tmp_path / "avx2", [cpu_record(f"a{s}-{i}", s, 1.0) for s in (1, 2) for i in range(2)])
    new = write(tmp_path / "amx", [cpu_record(f"b{s}-{i}", s, f, avx512=True, triad=1.0)
                                   for s, f in ((1, 0.9), (2, 0.3)) for i in range(2)])
    verdicts, _ = against([new], [old])
    eff = {v.config["zero_stage"]: v for v in verdicts if v.metric == "matmul_eff_pct"}
    assert eff[1].verdict == "not comparable"   # 0.45x: 10 % below 0.5x, within the cpu's 35 %
    assert "fp32 matmul per byte of memory bandwidth (triad)" in eff[1].reason
    assert "one all memory traffic 0.50x; the regression lies 10.0 % below it, within the tolerance 35 %" in eff[1].reason
    assert eff[2].verdict == "regression" and eff[2].balance["dtype"] == "fp32"   # 0.15x: beyond what it allows
    rc, out, _ = run(capsys, new, "--against", old)
    assert rc == 1 and "between 0.50x (a step all memory traffic) and 1x (all matmuls), 1 configuration within that" \
        in " ".join(out.split())


def test_a_swap_in_ranking_is_named(tmp_path, capsys):
    old = write(tmp_path / "avx2", [cpu_record(f"a{s}", s, f) for s, f in ((1, 1.0), (2, 0.9), (3, 0.5))])
    new = write(tmp_path / "avx512", [cpu_record(f"b{s}", s, f, avx512=True) for s, f in ((1, 1.5), (2, 1.8), (3, 0.6))])
    rc, out, _ = run(capsys, new, "--against", old)
    # ZeRO-1 ahead of ZeRO-2 on the AVX2 box (1.0 against 0.9), behind it on the AVX-512 one (1.5 against 1.8)
    assert ("ranking of the configurations by samples/s changed: c2 and c1 swapped (c2 20.0 % ahead on Intel Xeon "
            "Platinum 8480+ (2 CPUs, AVX512 +avx512_bf16 +amx_bf16), c1 11.1 % on AMD EPYC (2 CPUs, AVX2))"
            ) in " ".join(out.split())


def test_a_swap_within_a_cpu_run_s_noise_is_a_tie_and_one_beyond_it_on_either_box_is_not(tmp_path, capsys):
    # ZeRO-1 against ZeRO-2: 1.0 vs 0.9 on the AVX2 box (11.1 %), 1.5 vs 1.6 on the AVX-512 one (6.7 %):
    # both within the cpu's 15 %, a tie; ZeRO-3 against ZeRO-2: 0.5 vs 0.9 before, 1.9 vs 1.6 now
    # (18.7 % ahead, beyond it), a change although ZeRO-2 led by 80 % before
    old = write(tmp_path / "avx2", [cpu_record(f"a{s}", s, f) for s, f in ((1, 1.0), (2, 0.9), (3, 0.5))])
    new = write(tmp_path / "avx512", [cpu_record(f"b{s}", s, f, avx512=True) for s, f in ((1, 1.5), (2, 1.6), (3, 1.9))])
    verdicts, _ = against([new], [old])
    assert {v.device for v in verdicts if v.machines} == {"cpu"}
    (pair,) = machine_pairs(verdicts, ("matmul_eff_pct",))
    stage = lambda pairs: [(a.config["zero_stage"], b.config["zero_stage"]) for a, b in pairs]  # noqa: E731
    assert pair.noise_pct == 15.0 and stage(pair.ties) == [(2, 1)]
    assert stage(pair.swapped) == [(3, 2), (3, 1)]
    rc, out, _ = run(capsys, new, "--against", old)
    text = " ".join(out.split())
    assert "ranking of the configurations by samples/s changed: c3 and c2 swapped (c3 18.7 % ahead on Intel" in text
    assert "c2 and c1 tied (c2 6.7 % ahead on Intel" in text and "c1 11.1 % on AMD EPYC (2 CPUs, AVX2)), within a run's noise (15 %)" in text


def test_a_machine_s_device_comes_from_its_probe_else_its_gpus(sides):
    from harness.verdict.cross_machine import device_of, rank_noise_pct
    record = json.loads((Path(sides[0]) / "01-z0.json").read_text())
    env = record["environment"]
    assert device_of(env) == "cuda"
    for machine in [env["machine"]] + [n["machine"] for n in env.get("nodes") or []]:
        machine.pop("probe", None)
    assert device_of(env) == "cuda", "no probe: the GPUs named"
    assert device_of(json.loads(CPU_RECORD.read_text())["environment"]) == "cpu"
    assert device_of(None) is None and device_of({}) is None
    assert rank_noise_pct(None) == 3.0, "where nothing says, the narrowest: no tie on a guess"


def test_the_aggregate_is_a_geometric_mean():
    assert geomean([0.5, 2.0]) == pytest.approx(1.0) and geomean([0.9]) == pytest.approx(0.9)
    assert geomean([]) is None and geomean([float("nan"), 0.0]) is None


def test_the_nightly_page_says_the_pair_in_a_line(sides):
    """A first night on a new machine is judged against another machine's references: its HTML page says what
    nightly.md and compare say of the pair, speed, efficiency within the balance, ranking."""
    from harness.report.nightly_page import nightly_page

    verdicts, _ = against([sides[0]], [sides[1]])
    page = nightly_page("h100", "2026-12-03", {"references": verdicts}, load_records([sides[0]]), {})
    (line,) = [p for p in page.splitlines() if '<p class="pair">' in p]
    assert "H100 80GB HBM3 runs these 4 configurations at 0.961x the H200&#x27;s samples/s" in line
    assert "between 0.69x (a step all memory traffic) and 1x (all matmuls), 3 configurations within that" in line
