"""The performance model against the published tables (`python -m harness model --validate`):
issue 13's targets hold, no published cell calibrates its own prediction, and a checkout without
the paper's table gets a clear error."""
from __future__ import annotations

import copy

import pytest

from harness.config.compose import compose
from harness.errors import HarnessError
from harness.model import validation
from harness.model.validation import TARGETS, format_validation, load_published, validate_model
from harness.verdict.references import Reference

_CACHE: dict = {}


def _compose(overrides):
    key = tuple(overrides)
    if key not in _CACHE:
        _CACHE[key] = compose(list(overrides))
    return copy.deepcopy(_CACHE[key])


@pytest.fixture(scope="module")
def result():
    return validate_model(_compose)


def test_every_target_of_the_issue_holds(result):
    text = format_validation(result)
    failed = [t for t in result.targets if not t.ok]
    assert not failed, f"missed: {failed}\n{text}"
    m1, m2 = result.tables
    assert m1.oom_right + m2.oom_right == TARGETS["oom_right"] == len(result.cells)
    assert m2.loo_median_pct <= 10 and m2.loo_over25 <= 2 and m1.loo_median_pct <= 10
    assert m2.one_cell_median_pct <= 20


def test_every_published_cell_is_there_and_predicted(result):
    """34 cells (10 Model 1, 24 Model 2); every ok cell has a leave-one-out prediction and, but for the
    calibrating ZeRO-1 baseline of its platform, a one-cell prediction."""
    assert sum(c.table == "model1" for c in result.cells) == 10
    assert sum(c.table == "model2" for c in result.cells) == 24
    for c in result.cells:
        if c.status == "ok":
            assert c.loo is not None and c.loo > 0
            baseline = (c.zero_stage, c.micro_batch_size) == validation.BASELINE[c.table]
            assert (c.one_cell is None) == baseline
        else:
            assert c.loo is None and not c.predicted_mem_gib <= c.capacity_gib


def test_every_finding_is_reproduced_or_explained(result):
    names = " ".join(f.name for f in result.findings)
    for key in ("takeaway 1", "takeaway 2", "takeaway 3", "grad_acc 2", "ZeRO-3", "H100", "step 3"):
        assert key in names
    for f in result.findings:
        assert f.published and f.model
        assert f.reproduced or len(f.explanation) > 40, f


def test_a_cell_never_calibrates_its_own_prediction():
    """Doubling one published value changes no leave-one-out prediction of that cell (it is held
    out), but changes the predictions of the cells it calibrates."""
    refs = load_published()
    target = next(r for r in refs if r.platform == "roce-h100" and r.benchmark == "llama-8b-kd"
                  and r.metric == "samples_per_s" and r.config.get("zero_stage") == 3 and r.config.get("micro_batch_size") == 128)
    doubled = [Reference.from_dict({**r.to_dict(), "value": r.value * 2, "samples": [r.value * 2]}) if r is target else r
               for r in refs]
    before, after = validate_model(_compose, refs), validate_model(_compose, doubled)

    def loo(v, stage, mb):
        return next(c.loo for c in v.cells if (c.platform, c.zero_stage, c.micro_batch_size) == ("roce-h100", stage, mb)
                    and c.table == "model2")
    assert loo(after, 3, 128) == pytest.approx(loo(before, 3, 128))
    assert loo(after, 2, 128) != pytest.approx(loo(before, 2, 128))     # mb 128's efficiency came from it


def test_the_outlier_is_predicted_but_calibrates_nothing(result):
    out = [c for c in result.cells if c.outlier]
    assert [(c.platform, c.zero_stage, c.micro_batch_size) for c in out] == [("roce-a100", 2, 64)]
    assert out[0].loo is not None and "outlier" in result.outlier_treatment


def test_without_the_paper_table_it_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(validation, "PUBLISHED", tmp_path / "sc25-pmbs.json")
    with pytest.raises(HarnessError, match="sc25-pmbs.json"):
        validate_model(_compose)


def test_the_parameters_are_printed_with_their_origin(result):
    text = format_validation(result)
    for p in result.params:
        assert p["name"] in text and p["kind"] in ("fitted", "declared", "assumed", "measured", "to measure")
    assert {p["name"] for p in result.params} >= {"fabric_efficiency.ib", "fabric_efficiency.roce", "paper_roce_efficiency",
                                                   "zero3_unexplained_s", "memory_model.FRAGMENTATION_FRACTION",
                                                   "host_s_per_module.sharded", "host_base_s.replicated"}
    unexplained = next(p for p in result.params if p["name"] == "zero3_unexplained_s")
    assert "UNEXPLAINED" in unexplained["source"] and "ib-a100" in unexplained["source"]
    assert all(any(f"gpu-runs/{d}" in p["source"] for d in ("2026-11-26-h200", "2026-11-27-h100", "2026-12-04-h200"))
               for p in result.params if p["kind"] == "measured")   # the GPU nodes' records
    floors = [p for p in result.params if p["name"].startswith("compiled_host_floor.")]
    assert len(floors) == 4 and {p["kind"] for p in floors} == {"measured"}


# ---- consequences for planning and tuning (issue 13, item 5) ------------------------------------

def _published_status(benchmark: str, platform: str) -> dict[tuple[int, int], str]:
    return {(int(r.config["zero_stage"]), int(r.config["micro_batch_size"])): r.status for r in load_published()
            if r.benchmark == benchmark and r.platform == platform and r.metric in ("batch_time_s", "samples_per_s")
            and "micro_batch_size" in r.config}


@pytest.mark.parametrize("suite,bench_name,platform", [("default-roce-h100", "llama-440m", "ib-a100"),
                                                       ("paper-model2", "llama-8b-kd", "roce-h100")])
def test_the_paper_suites_plan_no_predicted_oom_but_the_papers_own(suite, bench_name, platform):
    """`python -m harness plan platform=roce-h100` (its default suite: Model 1) and suite=paper-model2:
    the runs the model predicts out of memory are exactly the paper's OOM cells."""
    from harness.bench import plan_suite
    from harness.model.memory import memory_estimate

    _, planned = plan_suite(["platform=roce-h100", f"suite={suite}"])
    training = [p for p in planned if p.cfg.kind.value == "training"]
    got = {(p.cfg.zero.stage, p.cfg.workload.micro_batch_size): memory_estimate(p.cfg).fits for p in training}
    published = _published_status(bench_name, platform)
    assert set(got) == set(published)
    assert {k for k, fits in got.items() if not fits} == {k for k, s in published.items() if s == "oom"}


def test_tune_step2_on_model2_keeps_every_measured_cell_and_predicts_the_papers_winner_first():
    """`make tune PLATFORM=roce-h100 WORKLOAD=llama-8b-kd`, step 2, as the tuner plans it before any
    measurement (the model calibrated on the reference table): no cell the paper measured is pruned
    as predicted OOM, the paper's OOM cells are, and the best prediction is the paper's winner,
    ZeRO-2 micro-batch 128 x grad-acc 2."""
    from harness.model.calibration import calibrate
    from harness.model.perfmodel import predict
    from harness.verdict.references import load_references
    from harness.tune import space
    from harness.tune.outcome import by_prediction, predicted_oom

    refs = load_references()
    base = ["suite=single", "platform=roce-h100", "workload=llama-8b-kd"]
    cands = space.batch_candidates(_compose(base))
    pred = {}
    for c in cands:
        cfg = _compose(base + list(c.overrides))
        pred[c.key] = predict(cfg, calibrate([], cfg, refs)).to_dict()
    pruned = {(dict(c.params)["stage"], dict(c.params)["micro_batch_size"]) for c in cands if predicted_oom(pred[c.key])}
    published = _published_status("llama-8b-kd", "roce-h100")
    assert not {k for k, s in published.items() if s == "ok"} & pruned
    assert {k for k, s in published.items() if s == "oom"} <= pruned
    first = by_prediction([c for c in cands if not predicted_oom(pred[c.key])], pred)[0]
    assert (dict(first.params)["stage"], dict(first.params)["micro_batch_size"], dict(first.params)["grad_acc_steps"]) == (2, 128, 2)


@pytest.mark.parametrize("nodes, first", [(1, (1, 1, 16, "selective")), (16, (3, 1, 16, "none"))])
def test_tune_step2_at_seq_8192_puts_the_models_checkpointing_choice_first(nodes, first):
    """Issue 28 item 4: `make tune PLATFORM=roce-h100 WORKLOAD=llama-8b ARGS="platform.name=my-h100
    workload.seq_len=8192 ... tune.checkpointing=[none,every_4,every_2,selective,full]"`, step 2 as the
    tuner orders it before any measurement: on one 8-GPU node ZeRO-1 mb 1 with selective checkpointing
    (18.4 s, 9 % faster than full), on 16 nodes ZeRO-3 mb 1 with none (15.8 s), as `model --sweep
    --checkpointing` picks them."""
    from harness.model.calibration import calibrate
    from harness.model.perfmodel import predict
    from harness.verdict.references import load_references
    from harness.tune import space
    from harness.tune.outcome import by_prediction, predicted_oom

    refs = load_references()
    base = ["suite=single", "platform=roce-h100", "platform.name=my-h100", f"platform.nodes={nodes}",
            "workload=llama-8b", "workload.seq_len=8192", "workload.samples_per_step=16",
            "workload.micro_batch_size=1", "workload.activation_checkpointing=true",
            "tune.checkpointing=[none,every_4,every_2,selective,full]"]
    cands = space.batch_candidates(_compose(base))
    assert len(cands) == 3 * 5 * 5
    pred = {}
    for c in cands:
        cfg = _compose(base + list(c.overrides))
        pred[c.key] = predict(cfg, calibrate([], cfg, refs)).to_dict()
    best = by_prediction([c for c in cands if not predicted_oom(pred[c.key])], pred)[0].as_dict()
    assert (best["stage"], best["micro_batch_size"], best["grad_acc_steps"], best["checkpointing"]) == first
