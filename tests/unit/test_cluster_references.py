"""reference_results/cpu-cluster.json: the emulated 2-node cluster's references (three default-cpu-cluster
suites on the 2-core AVX-512 EPYC, reference_results/sources/cpu-cluster-avx512-epyc/, and three on the Zen 5 of
the same CPU name and ISA class, sources/cpu-cluster-zen5-epyc/, taken again there on 2026-12-06), made again from the kept records entry for
entry, and judging that day's nightly (tests/data/cluster_nights/) as its tolerances say."""
from __future__ import annotations

import collections
import json
from pathlib import Path

from cluster_nights import nights, rederived
from unit_helpers import REPO_ROOT

from contract.metrics import tolerances_for
from harness.__main__ import main
from harness.record import ResultRecord
from harness.verdict.compare import compare
from harness.verdict.references import load_references

SHIPPED = REPO_ROOT / "reference_results" / "cpu-cluster.json"
RUNS = REPO_ROOT / "reference_results" / "sources" / "cpu-cluster-avx512-epyc" / "2026-12-05"
SWEEPS = [RUNS.parent / "2026-12-05-sweeps" / w for w in ("w1", "w2", "w3")]
"""The sweeps that replaced the suites' collective entries and added large_busbw_gbps."""
ZEN5 = [REPO_ROOT / "reference_results" / "sources" / "cpu-cluster-zen5-epyc" / "2026-12-05" / s for s in ("s1", "s2", "s3")]
"""The Zen 5's three suites (the CPU's kind kept), each key beside the AVX-512 box's."""
ZEN5_AGAIN = [ZEN5[0].parent.parent / "2026-12-06" / s for s in ("s1", "s2", "s3")]
"""The Zen 5's entries taken again, with the small calls' lower quartile (kept across nodes from fe8e602 on)."""
ZEN5_CHECK = ZEN5_AGAIN[0].parent / "s4"
"""The suite after them, not submitted."""


def comparable(e: dict) -> str:
    prov = {k: v for k, v in e.get("provenance", {}).items() if k not in ("date", "note")}   # the day, the --reason
    return json.dumps({**{k: v for k, v in e.items() if k != "provenance"}, "provenance": prov}, sort_keys=True)


def test_the_table_is_the_kept_suites_submitted(tmp_path: Path, capsys):
    table = tmp_path / "cpu-cluster.json"
    assert main(["submit", *(str(RUNS / s) for s in ("s1", "s2", "s3")), "--reference-file", str(table),
                 "--submitter", "suite maintainers"]) == 0
    assert "34 references of 11 configurations" in " ".join(capsys.readouterr().out.split())
    assert main(["submit", *map(str, SWEEPS), "--reference-file", str(table), "--submitter", "suite maintainers",
                 "--replace", "--reason", "the largest sizes' busbw"]) == 0
    assert "20 references of 8 configurations (16 replaced, 4 added)" in " ".join(capsys.readouterr().out.split())
    assert main(["submit", *map(str, ZEN5), "--reference-file", str(table), "--submitter", "suite maintainers"]) == 0
    assert "38 references of 11 configurations (38 added; 38 beside another machine's reference of its key, 0 not)" \
        in " ".join(capsys.readouterr().out.split())
    assert main(["submit", *map(str, ZEN5_AGAIN), "--reference-file", str(table), "--submitter", "suite maintainers",
                 "--replace", "--reason", "retaken with the small calls' lower quartile"]) == 0
    assert "42 references of 11 configurations (38 replaced, 4 added" in " ".join(capsys.readouterr().out.split())
    made = sorted(comparable(e) for e in json.loads(table.read_text(encoding="utf-8"))["references"])
    assert made == sorted(comparable(e) for e in json.loads(SHIPPED.read_text(encoding="utf-8"))["references"])


def test_its_tolerances_are_the_platforms_measured_ones():
    tolerance = tolerances_for("cpu-cluster")
    for ref in load_references([SHIPPED]):
        assert ref.platform == "cpu-cluster" and ref.num_samples == 3 and ref.status == "ok"
        assert ref.tolerance_pct == tolerance.get(ref.metric, tolerance["default"]), ref.metric


def night(name: str) -> list[ResultRecord]:
    """A kept night, its sweeps made again from their rows (so that they carry large_busbw_gbps)."""
    return [rederived(r) for r in nights()[name]]


def test_that_days_nightly_is_judged_by_it_and_a_slower_link_regresses():
    """The nightly's sweeps and runs share the default suite's keys (its fewer steps are no part of one); what it does
    not run (ZeRO-3, broadcast, reduce_scatter) is 'missing', which the nightly lists apart."""
    refs = load_references([SHIPPED])
    for name in ("n01", "n07", "n13"):
        counts = collections.Counter(v.verdict for v in compare(night(name), refs) if v.verdict != "missing")
        assert counts["pass"] >= 14 and not counts.keys() - {"pass", "insufficient data"}, (name, counts)
    slowed = compare(night("s500mbit"), refs)
    regressed = {(v.benchmark, v.metric) for v in slowed if v.verdict == "regression"}
    assert {("all_reduce", "avg_busbw_gbps"), ("all_gather", "avg_busbw_gbps"),
            ("llama-tiny", "samples_per_s")} <= regressed
    assert all(v.environment_diff.get("links.node1/eth0") == [1.0, 0.5] for v in slowed if v.verdict == "regression")
    three_quarters = compare(night("s750mbit"), refs)
    regressed = {(v.benchmark, v.metric) for v in three_quarters if v.verdict == "regression"}
    assert {("all_reduce", "large_busbw_gbps"), ("all_gather", "large_busbw_gbps")} <= regressed, regressed
    assert not {("all_reduce", "avg_busbw_gbps"), ("all_gather", "avg_busbw_gbps")} & regressed


def test_the_zen5s_suites_are_judged_by_its_own_entries():
    """Each of its suites against the table: by the Zen 5's entry of its key, never the AVX-512 box's (before its
    own, a suite of it read 20 of 30 verdicts not comparable: the probes' triad, 51.6 against 31.6 GB/s)."""
    refs = load_references([SHIPPED])
    own = {(r.benchmark, json.dumps(r.config, sort_keys=True), r.metric): r.value
           for r in refs if "family 26 model 2" in r.machine()}
    assert len(own) == 42 and sum(1 for key in own if key[2] == "small_p25_us") == 4
    for folder in [*ZEN5_AGAIN, ZEN5_CHECK]:
        recs = [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
                for p in sorted(folder.glob("0*.json"))]
        verdicts = [v for v in compare(recs, refs) if v.verdict != "missing"]
        assert len(verdicts) == 34 and not {v.verdict for v in verdicts} - {"pass", "insufficient data"}
        assert all(v.reference == own[(v.benchmark, json.dumps(v.config, sort_keys=True), v.metric)] for v in verdicts)
