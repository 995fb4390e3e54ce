"""One reference of a key per machine (harness/verdict/references.py Reference.identity): the cpu platform's
CI boxes are 2-core EPYCs of two kinds, AVX2 only and AVX-512, which the capability probe tells apart, so each
keeps its own references in cpu.json; submit adds the second machine's beside the first's, and compare judges
a run by the one whose machine can judge it. Real records: the AVX-512 EPYC's three default-cpu suites of
2026-12-03 and its three collective sweeps of 2026-12-04, the first to time each small call
(reference_results/sources/cpu-avx512-epyc/), the AVX2 EPYC's references of 2026-11-26; then the boxes whose
records keep the CPU's kind: a Zen 5, an AVX2 EPYC of family 25 model 1 and an AVX-512 one of family 25 model 17."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from unit_helpers import REPO_ROOT

from harness.__main__ import main
from harness.record import ResultRecord
from harness.verdict.compare import compare, outside_runs
from harness.verdict.references import Reference, load_references, validate_reference_file

SHIPPED = REPO_ROOT / "reference_results" / "cpu.json"
RUNS = REPO_ROOT / "reference_results" / "sources" / "cpu-avx512-epyc" / "2026-12-03"
SWEEPS = [RUNS.parent / "2026-12-04-collectives" / r for r in ("r1", "r2", "r3")]
"""The collective sweeps that replaced the 2026-12-03 suites' collective entries and added small_median_us."""
LARGE = [RUNS.parent / "2026-12-05-collectives" / r for r in ("r1", "r2", "r3")]
"""The sweeps that replaced those again and added large_busbw_gbps."""
ZEN5_RUNS = [REPO_ROOT / "reference_results" / "sources" / "cpu-zen5-epyc" / "2026-12-05" / s for s in ("s1", "s2", "s3")]
"""The Zen 5's three default-cpu suites: the same CPU name and ISA class as the AVX-512 box, its kind kept."""
ZEN5_BOUND = [REPO_ROOT / "reference_results" / "sources" / "cpu-zen5-epyc" / "2026-12-06-bound" / s
              for s in ("s1", "s2", "s3")]
"""Its three default-cpu suites whose collective sweep binds each rank to its own CPU: their collective records."""
ZEN5_EXCHANGE = [REPO_ROOT / "reference_results" / "sources" / "cpu-zen5-epyc" / "2026-12-06-exchange" / s
                 for s in ("s3", "s4", "s5", "s6")]
"""Its bound sweeps that read the host's exchange pulse calm (four of seven), which replaced the bound entries."""
AVX2_BOUND = [REPO_ROOT / "reference_results" / "sources" / "cpu-avx2-epyc" / "2026-12-06-bound" / s
              for s in ("s1", "s2", "s5", "s6", "s7")]
"""The AVX2 EPYC's (family 25) bound sweeps that read the exchange pulse calmest (five of seven): its bound entries."""
ZEN4_RUNS = REPO_ROOT / "reference_results" / "sources" / "cpu-avx512-epyc" / "2026-12-07-family25"
"""The AVX-512 EPYC of family 25 model 17: three default-cpu suites (b1-b3, their training records) and seven bound
sweeps (s1-s7, their first runs): its own entries of every key the default suite has."""
AVX2, AVX512 = "AMD EPYC (2 CPUs, AVX2)", "AMD EPYC (2 CPUs, AVX512 +avx512_bf16)"
ZEN5 = "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2)"
ZEN3 = "AMD EPYC (2 CPUs, AVX2; family 25 model 1)"
ZEN4 = "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 25 model 17)"
NOT_KEPT = ("all_reduce", "small_median_us")
"""The Zen 5's entry taken out of cpu.json after its submission (reference_results/sources/cpu-zen5-epyc/README.md):
all_reduce's small calls' median is bimodal on that box, 308-368 us in 8 of 10 sweeps and 992-1,083 in 2, which
three samples cannot stand for; its runs' figure is judged against the AVX-512 box's, not comparable there."""


def not_kept(e: dict) -> bool:
    ref = Reference.from_dict(e)
    return (ref.benchmark, ref.metric) == NOT_KEPT and ref.machine() == ZEN5 and not ref.config.get("bind_ranks")


def shipped() -> list[Reference]:
    return load_references([SHIPPED])


def records(suite: str = "s3") -> list[ResultRecord]:
    return [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
            for p in sorted((RUNS / suite).glob("*.json")) if p.name != "suite.json"]


def current(suite: str = "s3") -> list[ResultRecord]:
    """A default-cpu suite as the suite measures it now: the suite's training records, the last sweep's."""
    sweep = [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
             for p in sorted(LARGE[-1].glob("00-collectives-*.json"))]
    return [r for r in records(suite) if r.kind == "training"] + sweep


def zen4_firsts() -> list[Path]:
    """The family 25 model 17 box's submitted records: its suites' training runs, its sweeps' first runs."""
    return [p for b in ("b1", "b2", "b3") for p in sorted((ZEN4_RUNS / b).glob("0[1-9]-*.json"))] + \
        [p for s in range(1, 8) for p in sorted((ZEN4_RUNS / f"s{s}").glob("00-collectives-cpu-short-*.json"))
         if "confirm" not in p.name]


def avx2_table(tmp_path: Path) -> Path:
    """cpu.json as it was before the AVX-512 box's submission: the AVX2 box's references alone."""
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    data["references"] = [e for e in data["references"] if Reference.from_dict(e).machine() == AVX2]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def test_the_shipped_table_keeps_each_keys_reference_of_each_epyc():
    refs = shipped()
    by_machine: dict[str, set] = {}
    for r in refs:
        by_machine.setdefault(r.machine(), set()).add(r.key())
    assert sorted(by_machine) == [AVX2, ZEN3, AVX512, ZEN4, ZEN5]
    bound = {r.key() for r in refs if r.config.get("bind_ranks")}
    assert len(bound) == 28 and bound <= by_machine[ZEN5]   # the bound sweep's keys: the Zen 5's, and the AVX2
    assert by_machine[ZEN3] == bound   # box's of family 25, which kept no other entry (its training: the AVX2 box's)
    assert by_machine[ZEN4] == {k for k in by_machine[ZEN5] if k[1].startswith("llama")} | bound   # the default
    # suite's keys, its sweep bound (the Zen 5's unbound collective entries predate the binding)
    assert {k[3] for k in bound} == {"avg_busbw_gbps", "large_busbw_gbps", "small_time_us", "small_median_us",
                                     "small_p25_us", "shared_busbw_gbps", "shared_small_time_us"}
    assert by_machine[ZEN5] - bound == {k for k in by_machine[AVX512] if (k[1], k[3]) != NOT_KEPT}   # the same suite
    assert by_machine[AVX2] < by_machine[AVX512]   # every AVX2 key, and the collectives' newer metrics
    assert {k[3] for k in by_machine[AVX512] - by_machine[AVX2]} == {
        "small_time_us", "shared_busbw_gbps", "shared_small_time_us", "small_median_us", "large_busbw_gbps"}
    assert validate_reference_file(json.loads(SHIPPED.read_text(encoding="utf-8"))) == []


def test_a_second_machines_records_are_added_beside_the_tables_and_its_own_again_refused(tmp_path, capsys):
    table = avx2_table(tmp_path)
    before = {Reference.from_dict(e).identity(): e for e in json.loads(table.read_text())["references"]}
    args = ["submit", *(str(RUNS / s) for s in ("s1", "s2", "s3")), "--reference-file", str(table),
            "--submitter", "ops"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "59 references of 15 configurations (59 added; 47 beside another machine's reference of its key, 12 not)" \
        in " ".join(out.split()), out
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert f"added c7 samples_per_s 29.361 samples/s 3 {AVX2}" in rows     # ZeRO-1 mb 2 x ga 4, beside the AVX2 box's
    assert "added c2 shared_small_time_us 814.109 us 3 -" in rows         # a key new to the table: added alone
    assert f"measured on {AVX512}" in " ".join(out.split())
    assert all(len(line) <= 120 for line in out.splitlines())   # a table a person reads (was 59 lines of 200-400)
    legend = [line for line in out.splitlines() if line.startswith("  c")]
    assert legend[6].startswith("  c7   cpu/llama-tiny ZeRO-1 mb 2 x ga 4 seq 128")   # by stage, then micro-batch
    after = json.loads(table.read_text())
    assert validate_reference_file(after) == []
    got = {Reference.from_dict(e).identity() for e in after["references"]}
    assert got == {r.identity() for r in shipped()
                   if r.metric not in ("small_median_us", "large_busbw_gbps") and r.machine() not in (ZEN5, ZEN3, ZEN4)}
    assert all(e == before[Reference.from_dict(e).identity()] for e in after["references"]
               if Reference.from_dict(e).machine() == AVX2)   # the first machine's untouched
    text = table.read_text()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"already has cpu llama-tiny" in err and f"measured on {AVX512} (" in err and "--replace" in err
    assert table.read_text() == text   # nothing written
    assert main([*args, "--replace", "--reason", "rerun"]) == 0
    assert "(59 replaced; 47 beside another machine's" in " ".join(capsys.readouterr().out.split())
    again = json.loads(table.read_text())["references"]
    assert all(e == before[Reference.from_dict(e).identity()] for e in again
               if Reference.from_dict(e).machine() == AVX2)   # --replace replaces that machine's alone


def test_the_sweeps_timing_each_small_call_replaced_that_machines_collective_entries_alone(tmp_path, capsys):
    """The 2026-12-03 suites, then the 2026-12-04 sweeps with --replace, then the 2026-12-05 ones, then the Zen
    5's suites, its bound sweeps, those again with the exchange pulse, the AVX2 box's (family 25) bound sweeps, and
    the AVX-512 box of family 25 model 17's suites and sweeps: cpu.json as shipped, entry for entry."""
    table = avx2_table(tmp_path)
    assert main(["submit", *(str(RUNS / s) for s in ("s1", "s2", "s3")), "--reference-file", str(table),
                 "--submitter", "suite maintainers"]) == 0
    assert main(["submit", *map(str, SWEEPS), "--reference-file", str(table), "--submitter", "suite maintainers",
                 "--replace", "--reason", "the small calls timed one by one"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "20 references of 8 configurations (16 replaced, 4 added; 4 beside another machine's" in out, out
    assert main(["submit", *map(str, LARGE), "--reference-file", str(table), "--submitter", "suite maintainers",
                 "--replace", "--reason", "the largest sizes' busbw"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "24 references of 8 configurations (20 replaced, 4 added; 4 beside another machine's" in out, out
    assert main(["submit", *map(str, ZEN5_RUNS), "--reference-file", str(table), "--submitter", "suite maintainers"]) == 0
    out = capsys.readouterr().out
    assert "67 references of 15 configurations (67 added; 67 beside another machine's" in " ".join(out.split()), out
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "added c7 samples_per_s 46.858 samples/s 3 m1, m2" in rows and "added c1 small_median_us 193.510 us 3 m2" in rows
    assert f"  m1: {AVX2}" in out.splitlines() and f"  m2: {AVX512}" in out.splitlines()   # the machines beside, once
    assert all(len(line) <= 120 for line in out.splitlines())
    assert main(["submit", *(str(p) for s in ZEN5_BOUND for p in sorted(s.glob("00-collectives-*.json"))),
                 "--reference-file", str(table), "--submitter", "suite maintainers"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "28 references of 8 configurations (28 added" in out and "beside" not in out, out   # no other machine's
    assert main(["submit", *map(str, ZEN5_EXCHANGE), "--reference-file", str(table), "--submitter",
                 "suite maintainers", "--replace", "--reason", "the exchange pulse"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "28 references of 8 configurations (28 replaced" in out, out
    assert main(["submit", *(str(p) for s in AVX2_BOUND for p in sorted(s.glob("00-collectives-*.json"))),
                 "--reference-file", str(table), "--submitter", "suite maintainers"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "28 references of 8 configurations (28 added; 28 beside another machine's" in out, out
    assert main(["submit", *map(str, zen4_firsts()), "--reference-file", str(table), "--submitter",
                 "suite maintainers"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "71 references of 15 configurations (71 added; 71 beside another machine's" in out, out
    strip = ("date", "note")   # the day it was made, and the note that carries the --reason given

    def comparable(e: dict) -> str:
        prov = {k: v for k, v in e.get("provenance", {}).items() if k not in strip}
        return json.dumps({**{k: v for k, v in e.items() if k != "provenance"}, "provenance": prov},
                          sort_keys=True)
    made = sorted(comparable(e) for e in json.loads(table.read_text())["references"] if not not_kept(e))
    assert made == sorted(comparable(e) for e in json.loads(SHIPPED.read_text(encoding="utf-8"))["references"])


def test_a_run_is_judged_by_its_own_machines_reference_and_the_others_are_not_missing():
    refs = shipped()
    verdicts, outside = outside_runs(compare(current(), refs), current())
    assert {v.config.get("bind_ranks") for v in outside} == {True}   # the bound sweep's, which no run here made
    assert verdicts and not [v for v in verdicts if v.verdict in ("not comparable", "missing", "new")], \
        [(v.metric, v.verdict, v.reason) for v in verdicts if v.verdict != "pass"]
    own = {(r.benchmark, json.dumps(r.config, sort_keys=True), r.metric): r.value for r in refs if r.machine() == AVX512}
    assert all(v.reference == own[(v.benchmark, json.dumps(v.config, sort_keys=True), v.metric)] for v in verdicts)


def test_a_run_on_the_other_box_is_judged_by_that_boxs_reference():
    """The same records as if measured on the AVX2 EPYC (its fingerprint, probe and all): judged by the AVX2
    references, which the AVX-512 ones do not stand in for."""
    refs = shipped()
    env = next(r.provenance.environment for r in refs if r.machine() == AVX2 and r.benchmark == "llama-tiny")
    moved = [ResultRecord.from_dict({**r.to_dict(), "environment": env}) for r in records()]
    verdicts = [v for v in compare(moved, refs) if v.metric == "samples_per_s"]
    theirs = {json.dumps(r.config, sort_keys=True): r.value for r in refs
              if r.machine() == AVX2 and r.metric == "samples_per_s"}
    assert len(verdicts) == 7 and all(v.reference == theirs[json.dumps(v.config, sort_keys=True)] for v in verdicts)
    assert all(v.verdict != "not comparable" for v in verdicts), [v.reason for v in verdicts]


def test_a_table_with_one_key_twice_on_one_machine_is_refused_by_name():
    data = json.loads(SHIPPED.read_text(encoding="utf-8"))
    data["references"].append(data["references"][0])
    problems = validate_reference_file(data)
    assert problems == [f"references/{len(data['references']) - 1}: same platform, benchmark, config, metric and "
                        "machine as references/0"]


@pytest.mark.parametrize("suite", ["s1", "s2", "s3"])
def test_each_submitted_suite_is_whole_and_of_one_commit(suite):
    recs = records(suite)
    assert len(recs) == 11 and all(r.status == "ok" for r in recs)
    assert {r.environment["suite_commit"] for r in recs} == {"210421681eb0156eb42c208422f0b8c2b4516f04-dirty"}


def zen5_records(suite: int = 0) -> list[ResultRecord]:
    return [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(ZEN5_RUNS[suite].glob("*.json")) if p.name != "suite.json"]


def test_the_zen5s_runs_are_judged_by_its_own_entries_and_before_them_were_not_comparable():
    """Its first suite against the table: every verdict by the Zen 5's entry of its key, none by the AVX-512
    box's of the same name and ISA class. Against the table as it was before them (measured, 2026-12-05): the
    training runs 1.3-1.6x faster, which their pulses explained as the machine's pace, the collectives apart
    by the probes' triad."""
    refs = shipped()
    verdicts = [v for v in compare(zen5_records(), refs) if v.verdict != "missing"]
    own = {(r.benchmark, json.dumps(r.config, sort_keys=True), r.metric): r.value for r in refs if r.machine() == ZEN5}
    dropped = [v for v in verdicts if (v.benchmark, v.metric) == NOT_KEPT]   # by the AVX-512 box's, apart
    assert len(dropped) == 1 and dropped[0].verdict == "not comparable" and "triad" in dropped[0].reason
    verdicts = [v for v in verdicts if v not in dropped]
    assert len(verdicts) == 58 and all(v.verdict in ("pass", "insufficient data") for v in verdicts), \
        [(v.metric, v.verdict, v.reason) for v in verdicts if v.verdict != "pass"]
    assert all(v.reference == own[(v.benchmark, json.dumps(v.config, sort_keys=True), v.metric)] for v in verdicts)
    before = [v for v in compare(zen5_records(), [r for r in refs if r.machine() != ZEN5]) if v.verdict != "missing"]
    speed = [v for v in before if v.metric == "samples_per_s"]
    assert len(speed) == 7 and all(v.verdict == "not comparable" and "faster during this run" in v.reason
                                   for v in speed), [v.reason for v in speed]
    busbw = [v for v in before if v.metric == "avg_busbw_gbps"]
    assert len(busbw) == 4 and all(v.verdict == "not comparable" and "triad" in v.reason for v in busbw)
    assert all(v.machines == [ZEN5, AVX512] for v in busbw), "shown against the nearest machine: its name's"


def test_the_zen5s_suites_keep_the_cpus_id_and_are_of_one_clean_commit():
    for suite in range(3):
        recs = zen5_records(suite)
        assert len(recs) == 11 and all(r.status == "ok" for r in recs)
        assert {r.environment["suite_commit"] for r in recs} == {"3bfa08f80551820f4f4acbe51547adebdbb678cc"}
        assert {json.dumps(r.environment["machine"]["cpu"]["id"], sort_keys=True) for r in recs} == {json.dumps(
            {"family": 26, "microcode": "0x1000065", "model": 2, "stepping": 1, "vendor": "AuthenticAMD"})}


def test_a_machine_no_reference_names_is_shown_against_the_one_whose_probe_read_nearest():
    """The Zen 5's first suite as if made on another CPU (an Intel Xeon: no entry's name, no kind agrees): none of
    the three EPYCs' references judges it, and it is shown against the one whose probe (fp32 matmul, triad) read
    nearest: the Zen 5's own figures (0.06 apart, in sum of |ln| of the ratios), not the AVX-512 box's (0.78) nor
    the AVX2 box's (1.52), which, first in the table, it was shown against before."""
    import copy

    from harness.probe import probe_distance

    refs, runs = shipped(), zen5_records()
    distance = {m: probe_distance(next(r for r in refs if r.machine() == m).provenance.environment,
                                  runs[0].environment) for m in (AVX2, AVX512, ZEN5)}
    assert distance[ZEN5] < 0.2 < distance[AVX512] < distance[AVX2], distance
    other = []
    for rec in runs:
        rec = copy.deepcopy(rec)
        rec.environment["machine"]["cpu"].update(model="Intel Xeon", id={"vendor": "GenuineIntel", "family": 6,
                                                                         "model": 207, "stepping": 2})
        other.append(rec)
    speed = [v for v in compare(other, refs) if v.metric == "samples_per_s" and v.run_ids]
    assert speed and all(v.verdict == "not comparable" for v in speed)
    assert {tuple(v.machines) for v in speed} == {("Intel Xeon (2 CPUs, AVX512 +avx512_bf16; family 6 model 207)",
                                                   ZEN5)}, {tuple(v.machines) for v in speed}
    assert all("AVX2" not in v.reason for v in speed)


def test_the_avx2_boxs_bound_sweeps_are_judged_by_its_own_entries_the_two_left_out_too():
    """Its seven bound sweeps of 2026-12-06 (22:15-22:17 UTC, commit 542b5d1, family 25 model 1): the five submitted
    and the two whose exchange pulse read slowest (42.5 and 41.2 us against the others' 32.8-38.3), left out. Each is
    judged by the family 25 entries, none by the Zen 5's of the same key; none reads a regression, though all_reduce's
    median small call read 444-490 us in two of them and 2,753-3,022 in the rest (held up by the tick:
    docs/collectives.md, "A median the tick held up"), which the five's median (2,796) stands for."""
    refs = shipped()
    own = {(r.benchmark, json.dumps(r.config, sort_keys=True), r.metric): r.value for r in refs if r.machine() == ZEN3}
    folder = AVX2_BOUND[0].parent
    held = []
    for sweep in sorted(folder.glob("s*")):
        recs = [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
                for p in sorted(sweep.glob("00-collectives-cpu-short-*.json")) if "confirm" not in p.name]
        assert len(recs) == 4 and {r.environment["machine"]["cpu"]["id"]["family"] for r in recs} == {25}
        assert {r.environment["suite_commit"] for r in recs} == {"542b5d1d2edc60b71974aecf5385a9f0dd065345"}
        verdicts = [v for v in compare(recs, refs) if v.verdict != "missing"]
        assert len(verdicts) == 20 and all(v.reference == own[(v.benchmark, json.dumps(v.config, sort_keys=True),
                                                               v.metric)] for v in verdicts)
        assert all(v.verdict in ("pass", "insufficient data", "not comparable") for v in verdicts), \
            [(sweep.name, v.metric, v.verdict, v.reason) for v in verdicts if v.verdict != "pass"]
        held += [v for v in verdicts if v.verdict == "not comparable"]
    assert [v.benchmark for v in held] == ["all_reduce", "all_reduce"] and all("held up" in v.reason for v in held)


def test_the_family_25_model_17_boxs_runs_are_judged_by_its_own_entries_and_before_them_were_not():
    """Its three default-cpu suites and seven bound sweeps (2026-12-07 12:57-13:06 UTC, the AVX-512 EPYC of family 25
    model 17): each run judged by that box's entry of its key, none a regression. Against the table as it was before
    them: the bound sweeps by the AVX2 box's entries, apart by ISA; the distillation run apart by the bf16 matmul
    (222 against the unnamed AVX-512 box's 417 GFLOP/s per core), the only figure that tells the two apart."""
    refs = shipped()
    own = {(r.benchmark, json.dumps(r.config, sort_keys=True), r.metric): r.value for r in refs if r.machine() == ZEN4}
    recs = [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8"))) for p in zen4_firsts()]
    assert len(recs) == 3 * 7 + 7 * 4 and all(r.status == "ok" for r in recs)
    assert {json.dumps(r.environment["machine"]["cpu"]["id"], sort_keys=True) for r in recs} == {json.dumps(
        {"family": 25, "microcode": "0x1000065", "model": 17, "stepping": 1, "vendor": "AuthenticAMD"})}
    assert {r.environment["suite_commit"] for r in recs} == {"d714399482a5eb222e94b6b97a253520a0780e6e-dirty"}
    verdicts = [v for v in compare(recs, refs) if v.verdict != "missing"]   # shared_*: judged against another range
    assert len(verdicts) == 63 and all(v.reference == own[(v.benchmark, json.dumps(v.config, sort_keys=True),
                                                           v.metric)] for v in verdicts)
    assert all(v.verdict in ("pass", "insufficient data", "not comparable") for v in verdicts), \
        [(v.metric, v.verdict, v.reason) for v in verdicts if v.verdict not in ("pass",)]
    before = [v for v in compare(recs, [r for r in refs if r.machine() != ZEN4]) if v.verdict != "missing"]
    bound = [v for v in before if v.config.get("bind_ranks")]
    assert bound and all(v.verdict == "not comparable" and "ISA" in v.reason and v.machines[1] == ZEN3
                         for v in bound), {(v.verdict, v.reason) for v in bound}
    kd = [v for v in before if v.benchmark == "llama-tiny-kd" and v.metric == "samples_per_s"]
    assert kd and all(v.verdict == "not comparable" and "bf16 matmul" in v.reason for v in kd)
