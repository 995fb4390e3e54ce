"""A run's own NCCL variables (config `nccl_env`) in the configuration's key: found running the README's
`bench -m suite=single kind=collective +nccl_env.NCCL_ALGO=Ring,Tree`, whose Ring and Tree runs the
comparison pooled as two repeats of one configuration ("n 2/0", one median of both settings)."""
from __future__ import annotations

import copy

from harness.verdict.ab import against
from harness.verdict.compare import compare
from harness.verdict.references import record_config, references_from_records
from test_compare import ENV, record, reference
from unit_helpers import typed


def tuned(i: int, samples_per_s: float, **nccl: str) -> dict:
    """A record of the test_compare configuration run with the NCCL variables given (as the ranks got them)."""
    rec = record(i, samples_per_s=(samples_per_s, "samples/s"), env={**ENV, "env": dict(nccl)})
    if nccl:
        rec["config"]["nccl_env"] = dict(nccl)
    return rec


def test_runs_of_two_nccl_settings_are_two_configurations_never_repeats_of_one():
    ring, tree, plain = typed([tuned(1, 100.0, NCCL_ALGO="Ring"), tuned(2, 50.0, NCCL_ALGO="Tree"), tuned(3, 100.0)])
    assert record_config(ring)["nccl_env"] == {"NCCL_ALGO": "Ring"}
    assert record_config(tree)["nccl_env"] == {"NCCL_ALGO": "Tree"}
    assert "nccl_env" not in record_config(plain)       # a run without its own keeps the key it always had
    refs = references_from_records([ring, tree], source="t", submitter="t", date="2026-12-03", system="t",
                                   tolerance_pct={"default": 5.0})
    speeds = {r.config["nccl_env"]["NCCL_ALGO"]: r.value for r in refs if r.metric == "samples_per_s"}
    assert speeds == {"Ring": 100.0, "Tree": 50.0}      # not one reference of "repeats" 50 and 100


def test_a_run_with_its_own_nccl_settings_is_still_judged_by_the_platforms_reference_naming_them():
    ref = reference([100.0, 100.0], env={**ENV, "env": {}})
    rows = [v for v in compare(typed([tuned(1, 50.0, NCCL_ALGO="Tree"), tuned(2, 51.0, NCCL_ALGO="Tree")]), [ref])
            if v.metric == "samples_per_s"]
    assert [v.verdict for v in rows] == ["regression"]
    assert rows[0].num_samples == 2
    assert rows[0].environment_diff["env.NCCL_ALGO"] == [None, "Tree"]


def test_the_reference_of_the_runs_own_settings_judges_it_before_the_platforms():
    plain = reference([100.0, 100.0], env={**ENV, "env": {}})
    tree_ref = copy.deepcopy(reference([50.0, 50.0], env={**ENV, "env": {"NCCL_ALGO": "Tree"}}))
    tree_ref.config["nccl_env"] = {"NCCL_ALGO": "Tree"}
    runs = typed([tuned(1, 50.0, NCCL_ALGO="Tree"), tuned(2, 50.5, NCCL_ALGO="Tree"),
                  tuned(3, 100.0), tuned(4, 100.5)])
    rows = {(v.config.get("nccl_env") or {}).get("NCCL_ALGO"): v for v in compare(runs, [tree_ref, plain])
            if v.metric == "samples_per_s"}
    assert rows["Tree"].verdict == "pass" and rows["Tree"].reference == 50.0
    assert rows[None].verdict == "pass" and rows[None].reference == 100.0


def test_compare_against_pairs_each_setting_with_its_own(tmp_path):
    import json

    def write(side: str, records: list[dict]) -> str:
        folder = tmp_path / side
        folder.mkdir()
        for rec in records:
            rec["run_id"] = f"{side}-{rec['run_id']}"
            (folder / f"{rec['run_id']}.json").write_text(json.dumps(rec), encoding="utf-8")
        return str(folder)

    old = write("old", [tuned(1, 100.0, NCCL_ALGO="Ring"), tuned(2, 50.0, NCCL_ALGO="Tree")])
    new = write("new", [tuned(1, 99.0, NCCL_ALGO="Ring"), tuned(2, 30.0, NCCL_ALGO="Tree")])
    verdicts, unmatched = against([new], [old], min_samples=1)
    rows = {v.config["nccl_env"]["NCCL_ALGO"]: v for v in verdicts if v.metric == "samples_per_s"}
    assert rows["Ring"].verdict == "pass" and rows["Ring"].reference == 100.0
    assert rows["Tree"].verdict == "regression" and rows["Tree"].reference == 50.0
    assert unmatched == ""
