"""cpu-cluster's tolerances against the nights they were measured from (tests/data/cluster_nights/: 13 quiet
nights of its nightly and two with the link slowed, 3 runs each, on the emulated 2-node cluster): every quiet
night judged against every other passes its collectives within them (at the default 10 % some were
regressions), and a link at half its rate is still a regression, named."""
from __future__ import annotations

import collections
import itertools

import pytest
from cluster_nights import nights as kept_nights
from cluster_nights import night_references, rederived

from contract.metrics import tolerances_for
from harness.nightly import baseline_references
from harness.record import ResultRecord
from harness.verdict.compare import compare

@pytest.fixture(scope="module")
def nights() -> dict[str, list[ResultRecord]]:
    return kept_nights()


refs = night_references


def quiet(nights) -> list[str]:
    return sorted(n for n in nights if n.startswith("n"))


def test_the_kept_nights_are_what_the_tolerances_were_measured_from(nights):
    assert len(quiet(nights)) == 13 and sorted(set(nights) - set(quiet(nights))) == ["s500mbit", "s750mbit"]
    for records in nights.values():
        assert len(records) == 12 and {r.platform for r in records} == {"cpu-cluster"}
        assert {r.status for r in records} == {"ok"}


def test_no_quiet_night_against_another_is_a_regression_at_the_clusters_tolerances(nights):
    """Each night's 3 sweeps of each op against references made of another night's 3 (a bench against one
    submission; the training runs are judged against the nightly's baseline below)."""
    sweeps = {n: [r for r in nights[n] if r.kind == "collective"] for n in quiet(nights)}
    found = {}
    for label, tolerance in (("cluster", tolerances_for("cpu-cluster")), ("default", tolerances_for("h100"))):
        counts = collections.Counter()
        made = {n: refs(sweeps[n], tolerance) for n in quiet(nights)}
        for a, b in itertools.permutations(quiet(nights), 2):
            counts.update((v.metric, v.verdict) for v in compare(sweeps[a], made[b]))
        found[label] = counts
    assert sum(found["cluster"].values()) == 13 * 12 * 2 * 2
    assert not [k for k in found["cluster"] if k[1] in ("regression", "improvement")], found["cluster"]
    # what the 10 % they replaced made of the same nights: the measurement behind the change
    assert found["default"][("small_time_us", "regression")] + found["default"][("avg_busbw_gbps", "regression")] == 22


def test_the_nightly_baseline_of_quiet_nights_passes_and_a_halved_link_is_a_regression_named(nights):
    names = quiet(nights)
    for i, night in enumerate(names[1:], start=1):
        earlier = [(n, r) for n in names[max(0, i - 7):i] for r in nights[n]]
        verdicts = compare(nights[night], baseline_references(earlier, "cpu-cluster", names[max(0, i - 7):i]))
        assert not [v for v in verdicts if v.verdict in ("regression", "improvement")], night
    earlier = [(n, r) for n in names[-7:] for r in nights[n]]
    verdicts = compare(nights["s500mbit"], baseline_references(earlier, "cpu-cluster", names[-7:]))
    regressed = {(v.benchmark, v.metric) for v in verdicts if v.verdict == "regression"}
    assert {("all_reduce", "avg_busbw_gbps"), ("all_gather", "avg_busbw_gbps"),
            ("llama-tiny", "samples_per_s")} <= regressed, regressed
    busbw = [v for v in verdicts if v.metric == "avg_busbw_gbps"]
    assert all(v.environment_diff.get("links.node1/eth0") == [1.0, 0.5] for v in busbw), busbw[0].environment_diff


def test_the_largest_sizes_busbw_holds_at_10_percent_and_sees_a_link_at_three_quarters(nights):
    """nccl-tests' average carries the latency-bound sizes; the largest sizes' busbw (large_busbw_gbps) is the
    link's: within the default 10 % on every quiet pair, and a regression at 750 Mbit/s where the average is not."""
    names = quiet(nights)
    sweeps = {n: [rederived(r) for r in nights[n] if r.kind == "collective"] for n in nights}
    tolerance = tolerances_for("cpu-cluster")
    assert tolerance.get("large_busbw_gbps", tolerance["default"]) == 10.0
    made = {n: refs(sweeps[n], tolerance) for n in names}
    verdicts = [v for a, b in itertools.permutations(names, 2) for v in compare(sweeps[a], made[b])
                if v.metric == "large_busbw_gbps"]
    assert len(verdicts) == 13 * 12 * 2 and {v.verdict for v in verdicts} == {"pass"}
    assert max(abs(v.worse_pct) for v in verdicts) < 5.0
    earlier = [(n, r) for n in names[-7:] for r in sweeps[n]]
    slowed = compare(sweeps["s750mbit"], baseline_references(earlier, "cpu-cluster", names[-7:]))
    got = {(v.benchmark, v.metric): v for v in slowed}
    for op in ("all_reduce", "all_gather"):
        large = got[(op, "large_busbw_gbps")]
        assert large.verdict == "regression" and 0.72 < large.value / large.reference < 0.78, large.reason
        assert large.environment_diff.get("links.node1/eth0") == [1.0, 0.75]
        assert got[(op, "avg_busbw_gbps")].verdict != "regression"
