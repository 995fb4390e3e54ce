"""The nightly's rolling baseline on a host that changes under one name (harness/nightly.py machine_nights): a
cloud VM of one CPU name is a Zen 5 (family 26) on some nights and the AVX-512 EPYC on others, 1.4-1.6x apart;
the baseline takes the last nights of tonight's machine and says which it left out. Real records: the Zen 5's
default-cpu suites of 2026-12-05 and the AVX-512 box's of 2026-12-03 (reference_results/sources/), the latter
with the id of a family 25 CPU laid in, as such a night's records would keep it since."""
from __future__ import annotations

import collections
import copy
import json

from unit_helpers import REPO_ROOT

from harness.nightly import baseline_references, judge, machine_nights
from harness.record import ResultRecord
from harness.report.nightly import write_reports
from harness.verdict.compare import compare
from harness.verdict.history import History

SOURCES = REPO_ROOT / "reference_results" / "sources"


def suite(path) -> list[ResultRecord]:
    return [ResultRecord.from_dict(json.loads(p.read_text(encoding="utf-8")))
            for p in sorted(path.glob("0*.json"))]


def zen5(n: int) -> list[ResultRecord]:
    return suite(SOURCES / "cpu-zen5-epyc" / "2026-12-05" / f"s{n}")


def other_epyc(n: int, keep_kind: bool = True) -> list[ResultRecord]:
    out = []
    for rec in suite(SOURCES / "cpu-avx512-epyc" / "2026-12-03" / f"s{n}"):
        d = copy.deepcopy(rec.to_dict())
        if keep_kind:
            env = d["environment"]
            for machine in [env["machine"]] + [node["machine"] for node in env.get("nodes") or []]:
                machine["cpu"]["id"] = {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1,
                                        "microcode": "0xa101148"}
        out.append(ResultRecord.from_dict(d))
    return out


def store_of(tmp_path, nights: list[tuple[str, list[ResultRecord]]]) -> History:
    store = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    for night, records in nights:
        store.start_night(night, "cpu", "nightly-cpu", str(tmp_path / night))
        store.add_runs(night, "cpu", 0, records)
        store.finish_night(night, "cpu")
    return store


def before(store: History, night: str) -> list[tuple[str, ResultRecord]]:
    """(night, record) of the store's nights before `night`, as the nightly reads them (harness/nightly.py judge)."""
    return store.records("cpu", store.earlier_nights("cpu", night, 28))


def test_the_baseline_takes_tonights_machines_nights_and_names_those_it_left_out(tmp_path):
    store = store_of(tmp_path, [("2026-12-01", other_epyc(1)), ("2026-12-02", zen5(1)), ("2026-12-03", other_epyc(2)),
                                ("2026-12-04", zen5(2)), ("2026-12-05", zen5(3))])
    tonight = [rec for _, rec in store.records("cpu", ["2026-12-05"])]
    nights, left_out = machine_nights(before(store, "2026-12-05"), tonight, 7)
    assert nights == ["2026-12-02", "2026-12-04"]
    assert left_out == ("of this machine, AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2); 1 earlier "
                        "night of AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 25 model 17) left out: 2026-12-03")
    tonight, verdicts, earlier_nights, _, _, words = judge(store, "cpu", "2026-12-05", [], 7)
    assert earlier_nights == nights and words == f"rolling baseline: nights 2026-12-02, 2026-12-04 ({left_out})"
    counts = collections.Counter(v.verdict for v in verdicts["baseline"])
    assert counts["pass"] >= 50 and not counts.keys() & {"regression", "not comparable"}, counts
    paths = write_reports(tmp_path / "out", platform="cpu", night="2026-12-05", verdicts=verdicts, records=tonight,
                          history={}, baseline=words)
    for kind in ("markdown", "html"):   # under the baseline's table, in each report
        text = paths[kind].read_text(encoding="utf-8")
        assert "1 earlier night of AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 25 model 17) left out: 2026-12-03" \
            in text, kind


def slowed(records: list[ResultRecord], factor: float) -> list[ResultRecord]:
    """The records with their samples/s at `factor` of what was measured: a regression of the software's."""
    out = []
    for rec in records:
        d = copy.deepcopy(rec.to_dict())
        if "samples_per_s" in d["metrics"]:
            d["metrics"]["samples_per_s"]["value"] *= factor
        out.append(ResultRecord.from_dict(d))
    return out


def test_a_baseline_pooling_both_machines_hides_a_regression_that_the_machines_own_nights_catch():
    """What the baseline did before it took tonight's machine's nights: the four earlier nights pooled put the
    other EPYC's runs (1.4-1.6x slower) among the samples, so tonight's Zen 5 runs slowed to 0.7x pass all 7;
    against its own two nights 5 are regressions (2 insufficient data), and at 0.6x 7 against none."""
    both = [(n, r) for n, recs in (("2026-12-01", other_epyc(1)), ("2026-12-02", zen5(1)),
                                   ("2026-12-03", other_epyc(2)), ("2026-12-04", zen5(2))) for r in recs]
    own = [(n, r) for n, r in both if n in ("2026-12-02", "2026-12-04")]

    def speed(earlier, factor):
        refs = baseline_references(earlier, "cpu", sorted({n for n, _ in earlier}))
        return collections.Counter(v.verdict for v in compare(slowed(zen5(3), factor), refs)
                                   if v.metric == "samples_per_s")
    assert speed(both, 0.7) == {"pass": 7} and speed(own, 0.7) == {"regression": 5, "insufficient data": 2}
    assert speed(both, 0.6)["regression"] == 0 and speed(own, 0.6) == {"regression": 7}


def test_a_night_of_the_other_kind_is_judged_by_its_own_and_nights_kept_before_the_kind_count_for_either(tmp_path):
    store = store_of(tmp_path, [("2026-12-01", other_epyc(1, keep_kind=False)), ("2026-12-02", zen5(1)),
                                ("2026-12-03", other_epyc(2)), ("2026-12-04", zen5(2)), ("2026-12-05", other_epyc(3))])
    tonight = [rec for _, rec in store.records("cpu", ["2026-12-05"])]
    assert machine_nights(before(store, "2026-12-05"), tonight, 7)[0] == ["2026-12-01", "2026-12-03"]
    zen5_night = [rec for _, rec in store.records("cpu", ["2026-12-04"])]
    assert machine_nights(before(store, "2026-12-04"), zen5_night, 7)[0] == ["2026-12-01", "2026-12-02"]
    nights, left_out = machine_nights(before(store, "2026-12-05"), tonight, 1)   # its machine's last night, and
    assert nights == ["2026-12-03"] and left_out.endswith("left out: 2026-12-04")  # the night since, of another
