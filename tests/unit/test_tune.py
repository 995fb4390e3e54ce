"""The tuner without launching anything: search spaces and their constraints, the strategies,
loss parity, and a whole tune over a fake runner (resume, OOM skipping, outputs)."""
from __future__ import annotations

import json

import pytest

from harness.config.choices import SearchStrategy
from harness.config.tune_schema import TuneConfig
from harness.errors import ConfigError, HarnessError
from harness.tune import parity, search, space
from harness.tune.space import Candidate
from unit_helpers import as_record, typed


# ---- spaces ------------------------------------------------------------------------------------
@pytest.mark.parametrize("c, mbs, expected", [
    (8, [], [(1, 8), (2, 4), (4, 2), (8, 1)]),
    (1024, [64, 128, 256], [(64, 16), (128, 8), (256, 4)]),
    (12, [], [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]),
])
def test_batch_space_keeps_c_fixed_and_divisible(composed, c, mbs, expected):
    cfg = composed([f"workload.samples_per_step={c}", "workload.micro_batch_size=1"])
    cfg.tune.micro_batch_sizes = mbs
    cands = space.batch_candidates(cfg)
    assert len(cands) == 3 * len(expected)  # x stages 1, 2, 3
    for cand in cands:
        d = cand.as_dict()
        assert d["micro_batch_size"] * d["grad_acc_steps"] == c
        assert f"workload.micro_batch_size={d['micro_batch_size']}" in cand.overrides
        assert f"zero=stage{d['stage']}" in cand.overrides
    assert sorted({(c_.as_dict()["micro_batch_size"], c_.as_dict()["grad_acc_steps"]) for c_ in cands}) == expected


def test_every_batch_candidate_composes_and_validates(composed):
    from harness.config.compose import compose

    cfg = composed([])
    for cand in space.batch_candidates(cfg):
        got = compose(list(cand.overrides))
        d = cand.as_dict()
        assert (got.zero.stage, got.workload.micro_batch_size, got.workload.grad_acc_steps) == \
            (d["stage"], d["micro_batch_size"], d["grad_acc_steps"])


def test_checkpointing_choices_multiply_step_2_and_each_composes(composed):
    from harness.config.compose import compose

    cfg = composed(["workload.samples_per_step=4", "workload.micro_batch_size=1"])
    cfg.tune.checkpointing = ["none", "every_2", "selective", "full"]
    cands = space.batch_candidates(cfg)
    assert len(cands) == 3 * 3 * 4   # stages x splits of 4 x choices
    seen = set()
    for cand in cands:
        d = cand.as_dict()
        w = compose(["workload.samples_per_step=4", *cand.overrides]).workload
        seen.add((d["checkpointing"], w.activation_checkpointing, w.checkpoint_every_n_layers, w.checkpoint_policy.value))
        assert w.micro_batch_size == d["micro_batch_size"]
    assert seen == {("none", False, 1, "full"), ("every_2", True, 2, "full"), ("selective", True, 1, "selective"),
                    ("full", True, 1, "full")}
    assert space.Candidate(2, (("stage", 3), ("checkpointing", "every_2"))).label() == "z3-ck-every_2"


def test_stack_choices_multiply_step_2_leaving_out_what_the_platform_refuses(composed):
    """tune.compile x tune.kernels add the training stack to step 2 (only the lists given become
    parameters); a choice the platform refuses at a stage (Liger without a GPU, DeepCompile under ZeRO-0)
    is left out of the space, with the reason, instead of failing as a trial."""
    from harness.config.compose import compose

    cfg = composed(["workload.samples_per_step=4", "workload.micro_batch_size=1"])   # the cpu platform
    cfg.tune.compile, cfg.tune.kernels = ["none", "torch"], ["eager", "liger"]
    cands = space.batch_candidates(cfg)
    assert len(cands) == 3 * 3 * 2            # stages x splits of 4 x (none, torch) with eager: liger refused
    assert {(c.as_dict()["compile"], c.as_dict()["kernels"]) for c in cands} == {("none", "eager"), ("torch", "eager")}
    for cand in cands:
        w = compose(["workload.samples_per_step=4", *cand.overrides]).workload
        assert (w.compile.value, w.kernels.value) == (cand.as_dict()["compile"], cand.as_dict()["kernels"])
    assert [r.split(": ")[0] for r in space.refused_stacks(cfg)] == [
        "compile=none kernels=liger, compile=torch kernels=liger at ZeRO-1/2/3"]
    assert space.stack_here(cfg) == (("compile", "none"), ("kernels", "eager"))
    assert space.Candidate(2, (("stage", 1), ("compile", "torch"), ("kernels", "liger"))).label() == "z1-c-torch-k-liger"
    gpu = composed(["platform=h100", "workload=llama-440m", "workload.samples_per_step=8", "workload.micro_batch_size=8"])
    gpu.tune.compile, gpu.tune.stages = ["deepcompile", "torch"], [0, 1]
    got = {(c.as_dict()["stage"], c.as_dict()["compile"]) for c in space.batch_candidates(gpu)}
    assert got == {(0, "torch"), (1, "deepcompile"), (1, "torch")} and "kernels" not in space.stack_here(gpu)
    gpu.tune.compile, gpu.tune.kernels = [], ["liger", "eager", "liger"]     # each once, in its order
    assert space.stack_choices(gpu) == [(("kernels", "liger"),), (("kernels", "eager"),)]
    assert [o for o in space.batch_candidates(gpu)[0].overrides if "workload.k" in o] == ["workload.kernels=liger"]
    plain = composed([])
    assert space.stack_choices(plain) == [()] and space.refused_stacks(plain) == []


@pytest.mark.parametrize("bad, message", [
    (["tune.compile=[fast]"], "tune.compile"),
    (["tune.kernels=[triton]"], "tune.kernels"),
    (["tune.checkpointing=[every_0]"], "tune.checkpointing"),
    (["tune.checkpointing=[sometimes]"], "not a checkpointing choice"),
    (["tune.checkpointing=[full,every_1]"], "each choice once"),
    (["tune.micro_batch_sizes=[3]"], "must divide C"),
    (["tune.steps=[4]"], "tune.steps"),
    (["tune.steps=[]"], "tune.steps"),
    (["tune.stages=[5]"], "tune.stages"),
    (["tune.budget=-1"], "tune.budget"),
    (["tune.bucket_sizes=[0]"], "tune.bucket_sizes"),
    (["tune.nccl_space={NCCL_ALGO:[Foo]}"], "NCCL_ALGO"),
    (["tune.loss_tolerance=0"], "tune.loss_tolerance"),
    (["zero=stage3", "zero.gradient_collective=reduce_scatter"], "already reduce-scatters"),
    (["zero=stage0", "zero.gradient_collective=reduce_scatter"], "no partitioned gradients"),
])
def test_bad_tune_settings_are_refused_naming_the_field(bad, message):
    from harness.config.compose import compose

    with pytest.raises(ConfigError, match=message):
        compose(bad)


def test_comm_space_per_stage(composed):
    cfg = composed([])
    cfg.tune.bucket_sizes = [100_000, 1_000_000]
    s12 = space.comm_candidates(cfg, 2)
    assert len(s12) == 2 * 2 * 2 * 2
    assert {c.as_dict()["gradient_collective"] for c in s12} == {"all_reduce", "reduce_scatter"}
    one = s12[0]
    assert "zero.reduce_bucket_size=100000" in one.overrides and "zero.allgather_bucket_size=100000" in one.overrides
    s3 = space.comm_candidates(cfg, 3)
    assert len(s3) == 2 * 2 * 2 * 2 and all("gradient_collective" not in c.as_dict() for c in s3)
    assert space.comm_candidates(cfg, 0) == []
    from harness.config.compose import compose
    for c in s12[:3] + s3[:3]:
        compose(["zero=stage2" if c in s12 else "zero=stage3", *c.overrides])  # every candidate is valid


def test_default_bucket_sizes_follow_the_model(composed):
    tiny = composed([])          # ~5.0M parameters
    assert space.bucket_sizes(tiny) == [100_000, 300_000, 1_200_000]
    big = composed(["workload=llama-8b"])
    assert space.bucket_sizes(big) == [125_500_000, 501_900_000, 1_000_000_000]


def test_allreduce_sizes_span_the_buckets(composed):
    cfg = composed([])  # fp32, 4,999,424 parameters, DeepSpeed's 5e8 default bucket holds them all
    lo, hi = space.allreduce_sizes(cfg)
    assert hi == 4_999_424 * 4 and lo == 100_000 * 4


def test_nccl_space_is_the_product(composed):
    cfg = composed([])
    cands = space.nccl_candidates(cfg)
    assert len(cands) == 2 * 3
    assert all(o.startswith("+nccl_env.NCCL_") for c in cands for o in c.overrides)


# ---- strategies --------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy, budget, n, expected", [
    ("auto", 0, 6, ("grid", 6)), ("auto", 0, 12, ("bayes", 3)), ("auto", 0, 40, ("bayes", 10)),
    ("grid", 0, 40, ("grid", 40)), ("bayes", 5, 40, ("bayes", 5)), ("grid", 50, 10, ("grid", 10)),
])
def test_choose(strategy, budget, n, expected):
    s, b = search.choose(TuneConfig(strategy=SearchStrategy(strategy), budget=budget), n)
    assert (s.value, b) == expected


def _cands(n):
    return [Candidate(2, (("x", i), ("y", i % 2))) for i in range(n)]


def test_grid_proposes_in_order_each_once():
    cands = _cands(4)
    g = search.GridSearch(list(reversed(cands)))
    g.observe(cands[3], 1.0)  # already known (the start point): not proposed again
    got = []
    while (c := g.propose()) is not None:
        got.append(c)
        g.observe(c, 0.5)
    assert got == [cands[2], cands[1], cands[0]]


def test_bayes_never_repeats_or_runs_excluded_and_covers_the_space():
    cands = [Candidate(3, (("a", a), ("b", b))) for a in range(4) for b in range(3)]
    excluded, runnable = cands[:3], cands[3:]
    bs = search.BayesSearch(runnable, excluded, seed=0)
    bs.observe(runnable[0], 5.0)  # measured before the search asked (a reused or model-first trial)
    proposed = []
    for _ in range(len(runnable) - 1):
        c = bs.propose()
        if c is None:
            break
        proposed.append(c)
        bs.observe(c, float(dict(c.params)["a"]))
    assert len(set(proposed)) == len(proposed) and runnable[0] not in proposed
    assert not set(proposed) & set(excluded)
    assert sorted(proposed, key=lambda c: c.params) == runnable[1:]  # every other runnable point, once


# ---- loss parity -------------------------------------------------------------------------------
def _rec(losses, status="ok"):
    return typed([{"status": status, "steps": [{"mode": "throughput", "loss": v} for v in losses]
                   + [{"mode": "profile", "loss": 99.0}]}])[0]


@pytest.mark.parametrize("mine, ref, tol, ok", [
    ([8.0, 7.0, 6.0], [8.0, 7.0, 6.0], 1e-3, True),
    ([8.0, 7.0, 6.001], [8.0, 7.0, 6.0], 1e-3, True),
    ([8.0, 7.0, 6.1], [8.0, 7.0, 6.0], 1e-3, False),
    ([8.0, float("nan")], [8.0, 7.0], 1e-3, False),
    ([8.0, 7.0], [8.0, 7.0, 6.0], 1e-3, True),  # compared over the common first steps
])
def test_parity(mine, ref, tol, ok):
    p = parity.check(_rec(mine), _rec(ref), tol)
    assert p.ok is ok and p.num_steps == min(len(mine), len(ref))


def test_parity_not_judged_without_losses():
    assert parity.check(_rec([], "oom"), _rec([8.0]), 1e-3).ok is None


# ---- a whole tune over a fake runner -----------------------------------------------------------
class FakeWorld:
    """Trials 'run' instantly: samples/s from a formula, OOM above a micro-batch, losses equal."""

    def __init__(self, oom_mb=8):
        self.launched: list[list[str]] = []
        self.batches: list[tuple[int, list[str]]] = []
        """(step, trial labels) of every launch: trials launched together are one batch."""
        self.oom_mb = oom_mb
        self.confirm_launched: list[str] = []
        """Names of the confirmation's runs (OUT/confirm/...: the same configurations again), in order."""
        self.confirm_values: dict[str, list[float]] = {}
        """default | winner -> the samples/s its confirmation runs measure, in order (empty: value(cfg))."""

    def run_many(self, runner, step, trials):
        self.batches.append((step, [name for name, _ in trials]))
        return [self.run(runner, step, name, ov) for name, ov in trials]

    def value(self, cfg):
        z = cfg.zero
        v = 10.0 + cfg.workload.micro_batch_size - (3 if z.stage == 3 else 0)
        v += 1.0 if z.overlap_comm else 0.0
        v += 0.5 if z.gradient_collective.value == "reduce_scatter" else 0.0
        w = cfg.workload
        v += 0.3 if w.activation_checkpointing and w.checkpoint_policy.value == "selective" else 0.0
        v += 0.2 if w.compile.value == "torch" else 0.0
        return v

    def measure(self, cfg, name, confirming):
        if confirming and self.confirm_values:
            return self.confirm_values["default" if name.startswith("default-") else "winner"].pop(0)
        return self.value(cfg)

    def run(self, runner, step, name, overrides):
        confirming = isinstance(step, str)
        if confirming:
            self.confirm_launched.append(name)
        else:
            self.launched.append(list(overrides))
        cfg = runner.compose(list(overrides))
        folder = runner.step_dir(step)
        folder.mkdir(parents=True, exist_ok=True)
        rid = f"{len(list(folder.glob('*.json'))):02d}-{name}"
        if cfg.kind.value == "collective":
            env = cfg.nccl_env
            busbw = 1.0 + (0.5 if env.get("NCCL_PROTO") == "Simple" else 0) + (0.2 if env.get("NCCL_ALGO") == "Tree" else 0)
            recs = [{"run_id": f"{rid}-{op}", "kind": "collective", "benchmark": op, "status": "ok",
                     "overrides": overrides, "metrics": {"avg_busbw_gbps": {"value": busbw, "unit": "GB/s"}},
                     "rows": [{"size_bytes": 1024, "out_of_place": {"busbw_gbps": busbw}, "in_place": None}],
                     "platform": "cpu", "config": {}, "environment": {}}
                    for op in (o.value for o in cfg.collective.ops)]
        else:
            oom = cfg.workload.micro_batch_size >= self.oom_mb
            recs = [{"run_id": rid, "kind": "training", "benchmark": cfg.workload.name,
                     "status": "oom" if oom else "ok", "reason": "out of memory" if oom else None,
                     "overrides": overrides, "platform": "cpu", "config": {}, "environment": {},
                     "metrics": {} if oom else {"samples_per_s": {"value": self.measure(cfg, name, confirming),
                                                                  "unit": "samples/s"}},
                     "steps": [] if oom else [{"mode": "throughput", "loss": 8.0 - i * 0.1} for i in range(4)]}]
        out = []
        for r in map(as_record, recs):
            path = folder / f"{r.run_id}.json"
            path.write_text(json.dumps(r.to_dict()))
            out.append((str(path.relative_to(runner.out)), r))
        return out


@pytest.fixture
def fake_tune(monkeypatch, tmp_path):
    return make_fake_tune(monkeypatch, tmp_path)


def make_fake_tune(monkeypatch, tmp_path):
    from harness.tune import trials, tuner

    world = FakeWorld()
    monkeypatch.setattr(trials.TrialRunner, "run_many", lambda self, step, specs: world.run_many(self, step, specs))

    def predictions(self, overrides_of):  # a model that knows memory grows with the micro-batch
        out = []
        for ov in overrides_of:
            cfg = self.runner.compose(ov)
            mem = 0.1 * cfg.workload.micro_batch_size
            out.append({"samples_per_s": world.value(cfg), "step_time_s": 1.0,
                        "memory": {"total_gib": mem, "capacity_gib": 0.5, "fits": mem <= 0.5}})
        return out

    monkeypatch.setattr(tuner.Tuner, "predictions", predictions)
    return world, tmp_path / "tune"


def _run_tune(out, *extra):
    from harness.tune.command import cli

    return cli(["tune.install_preset=false", f"out={out}", *extra])


def test_tune_skips_predicted_oom_and_finds_the_best(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=grid") == 0
    state = json.loads((out / "tune.json").read_text())
    step2 = state["steps"][1]
    skipped = [t for t in step2["trials"] if t["status"] == "skipped"]
    assert {t["params"]["micro_batch_size"] for t in skipped} == {8}  # 0.8 GiB > 0.5: never launched
    assert not any("workload.micro_batch_size=8" in ov for ov in world.launched)
    assert step2["best"] == "z1-mb4-ga2" or step2["best"] == "z2-mb4-ga2"
    assert state["steps"][2]["best"].startswith("ov1-gcrs")
    report = (out / "report.md").read_text()
    assert "What each step contributed" in report and "predicted" in report and "Loss parity" in report
    preset = (out / "best" / "tuned-cpu-llama-tiny.yaml").read_text()
    assert "zero.gradient_collective=reduce_scatter" in preset
    ds = json.loads((out / "best" / "deepspeed.json").read_text())
    assert ds["zero_optimization"]["overlap_comm"] is True


def test_tune_resumes_without_rerunning_finished_trials(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]") == 0
    first = len(world.launched)
    assert first > 3
    world.launched.clear()
    world.confirm_launched.clear()
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]") == 0
    assert world.launched == [] and world.confirm_launched == []  # every trial reused, the confirmation's too
    state = json.loads((out / "tune.json").read_text())
    assert all(t["reused"] for t in state["steps"][0]["trials"] if t["status"] != "skipped")


def test_interrupted_tune_resumes_where_it_stopped(fake_tune, monkeypatch):
    world, out = fake_tune
    real = world.run
    calls = {"n": 0}

    def dies_on_third(runner, step, name, ov):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(runner, step, name, ov)

    from harness.tune import trials
    monkeypatch.setattr(trials.TrialRunner, "run_many",
                        lambda self, s, specs: [dies_on_third(self, s, n, ov) for n, ov in specs])
    with pytest.raises(KeyboardInterrupt):
        _run_tune(out, "tune.strategy=grid", "tune.steps=[2]")
    done_before = list(world.launched)
    world.launched.clear()
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]") == 0
    assert not set(map(tuple, done_before)) & set(map(tuple, world.launched))  # nothing finished is rerun


def test_resume_refuses_a_different_tune(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.steps=[2]", "tune.budget=2") == 0
    with pytest.raises(HarnessError, match="different tune"):
        _run_tune(out, "tune.steps=[2]", "workload=llama-tiny-kd")


def test_out_with_other_results_is_refused(tmp_path, fake_tune):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.json").write_text("{}")
    with pytest.raises(HarnessError, match="not empty"):
        _run_tune(tmp_path / "other")


def test_bayes_respects_the_budget(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=bayes", "tune.budget=3", "tune.steps=[2]") == 0
    state = json.loads((out / "tune.json").read_text())
    ran = [t for t in state["steps"][0]["trials"] if t["status"] != "skipped"]
    assert len(ran) == 2  # + the default configuration (z1 mb2 ga4), a point of the space: 3
    assert len(world.launched) == 3  # the default, then two searched


def test_step1_tries_every_nccl_setting_and_step2_runs_with_the_best(fake_tune):
    world, out = fake_tune
    world.oom_mb = 10**6
    assert _run_tune(out, "platform=roce-h100", "platform.nodes=1", "platform.launcher=local", "tune.steps=[1,2]", "tune.stages=[1]", "tune.micro_batch_sizes=[2,4]") == 0
    state = json.loads((out / "tune.json").read_text())
    s1, s2 = state["steps"]
    runs = [t for t in s1["trials"] if t["role"] == "search"]
    assert len(runs) == 6 and all(t["status"] == "ok" and t["prediction"] is None for t in runs)  # never skipped
    best = next(t for t in s1["trials"] if t["label"] == s1["best"])
    assert best["params"] == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    assert s2["trials"][0]["role"] == "default+nccl"  # what step 1 gives the default configuration
    for t in s2["trials"]:
        assert "+nccl_env.NCCL_ALGO=Tree" in t["overrides"] and "+nccl_env.NCCL_PROTO=Simple" in t["overrides"]
    report = (out / "report.md").read_text()
    assert "step 1 (NCCL variables, on the default configuration)" in report


def test_one_rank_has_no_step1(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "platform=h100", "tune.steps=[1]") == 0
    state = json.loads((out / "tune.json").read_text())
    assert state["steps"][0]["note"] == "one rank: there is no collective to tune"
    assert all("kind=collective" not in ov for ov in world.launched)


def test_step2_measures_the_largest_fitting_micro_batch_first(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=bayes", "tune.budget=3", "tune.steps=[2]") == 0
    state = json.loads((out / "tune.json").read_text())
    first = [t for t in state["steps"][0]["trials"] if t["status"] != "skipped"][0]  # mb 8 is predicted out of memory (fake model): mb 4 fits
    assert first["params"] == {"stage": 1, "micro_batch_size": 4, "grad_acc_steps": 2}


def test_step2_tries_the_checkpointing_choices_and_keeps_the_best(fake_tune):
    """tune.checkpointing adds a dimension to step 2: each split x stage under each choice. The
    default configuration (no checkpointing) is the point `none` of that space and is not rerun;
    the best (selective, in the fake world) goes into step 3 and the preset."""
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]", "tune.checkpointing=[none,selective]") == 0
    state = json.loads((out / "tune.json").read_text())
    trials = state["steps"][0]["trials"]
    assert {t["params"]["checkpointing"] for t in trials} == {"none", "selective"}
    assert state["steps"][0]["best"] in ("z1-mb4-ga2-ck-selective", "z2-mb4-ga2-ck-selective")
    default = ["workload.micro_batch_size=2", "workload.grad_acc_steps=4", "workload.activation_checkpointing=false"]
    assert not any(all(o in ov for o in default) and "zero=stage1" in ov for ov in world.launched)
    assert all("workload.checkpoint_policy=selective" in ov for ov in world.launched
               if "workload.activation_checkpointing=true" in ov)


def test_step2_tries_the_stack_choices_the_platform_allows_and_keeps_the_best(fake_tune):
    """tune.compile x tune.kernels on the cpu platform: Liger is left out (a GPU only), said in the step's
    note, never launched; the default (none, eager) is that point of the space and is not rerun; the
    compiled configuration (faster in the fake world) wins."""
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]", "tune.compile=[none,torch]",
                     "tune.kernels=[eager,liger]") == 0
    state = json.loads((out / "tune.json").read_text())
    step = state["steps"][0]
    assert {(t["params"]["compile"], t["params"]["kernels"]) for t in step["trials"]} == {("none", "eager"), ("torch", "eager")}
    assert not any("workload.kernels=liger" in ov for ov in world.launched)
    assert ("left out (refused on this platform): compile=none kernels=liger, compile=torch kernels=liger at ZeRO-1/2/3: "
            "workload.kernels='liger' is invalid" in step["note"]) and "x compile x kernels" in step["title"]
    assert step["best"] in ("z1-mb4-ga2-c-torch-k-eager", "z2-mb4-ga2-c-torch-k-eager")
    default = ["zero=stage1", "workload.micro_batch_size=2", "workload.grad_acc_steps=4", "workload.compile=none"]
    assert not any(all(o in ov for o in default) for ov in world.launched)


def test_a_tune_that_compiles_shares_the_compilers_caches_unless_told_otherwise(fake_tune, tmp_path):
    """Every trial of a tune that may compile loads graphs compiled before (measure.compile_cache=warm): a
    compiled winner's step-3 knobs and confirmation repeats do not compile cold again; an eager tune and a
    tune given measure.compile_cache keep theirs."""
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=grid", "tune.steps=[2]", "tune.compile=[none,torch]") == 0
    assert world.launched and all("measure.compile_cache=warm" in ov for ov in world.launched)
    assert "measure.compile_cache=warm" in json.loads((out / "tune.json").read_text())["overrides"]
    world.launched.clear()
    assert _run_tune(tmp_path / "cold", "tune.steps=[2]", "tune.compile=[none,torch]",
                     "measure.compile_cache=cold") == 0
    assert world.launched and not any("measure.compile_cache=warm" in ov for ov in world.launched)
    world.launched.clear()
    assert _run_tune(tmp_path / "eager", "tune.steps=[2]") == 0
    assert world.launched and not any("compile_cache" in o for ov in world.launched for o in ov)


def test_bayes_spends_half_its_budget_on_the_models_fresh_best(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "tune.strategy=bayes", "tune.budget=4", "tune.steps=[2]") == 0
    state = json.loads((out / "tune.json").read_text())
    ran = [t["params"] for t in state["steps"][0]["trials"] if t["status"] != "skipped"]
    assert ran[0] == {"stage": 1, "micro_batch_size": 4, "grad_acc_steps": 2}  # the anchor
    assert ran[1] == {"stage": 2, "micro_batch_size": 4, "grad_acc_steps": 2}  # best predicted not yet run
    assert len(ran) == 3  # + the default configuration = the budget of 4


# ---- under Slurm: a step's trials launched together (one job array) ----------------------------
def s3_best(out):
    return json.loads((out / "tune.json").read_text())["steps"][-1]["best"]


def _launched_keys(world):
    return [tuple(sorted(ov)) for ov in world.launched]


def test_under_slurm_each_grid_step_is_one_launch_and_finds_what_the_local_tune_finds(fake_tune, tmp_path,
                                                                                      monkeypatch):
    world, out = fake_tune
    assert _run_tune(out, "platform.launcher=slurm", "tune.strategy=grid", "tune.steps=[2,3]") == 0
    steps = [step for step, _ in world.batches]
    assert steps[:3] == [2, 2, 3], world.batches  # the default alone, then one launch per step
    assert steps[3].startswith("confirm/") and len(steps) == 4  # then the confirmation's pairs, one launch
    assert world.batches[3][1] == [f"{side}-{i}" for i in (1, 2, 3) for side in ("default", s3_best(out))]
    state = json.loads((out / "tune.json").read_text())
    s2, s3 = state["steps"]
    ran2 = [t["label"] for t in s2["trials"] if t["status"] != "skipped" and t["role"] == "search"]
    assert world.batches[1][1] == ran2 and len(ran2) == s2["budget"] - 1  # the default point is known
    assert world.batches[2][1] == [t["label"] for t in s3["trials"] if t["status"] != "skipped"]
    assert len(set(_launched_keys(world))) == len(world.launched)  # nothing launched twice
    local = FakeWorld()
    from harness.tune import trials
    monkeypatch.setattr(trials.TrialRunner, "run_many", lambda self, step, specs: local.run_many(self, step, specs))
    assert _run_tune(tmp_path / "local", "tune.strategy=grid", "tune.steps=[2,3]") == 0
    here = json.loads((tmp_path / "local" / "tune.json").read_text())
    assert [s["best"] for s in here["steps"]] == [s2["best"], s3["best"]]
    assert len([b for b in local.batches if isinstance(b[0], int)]) == len(local.launched)  # one trial at a time


def test_under_slurm_bayes_asks_the_model_then_tpe_each_once_per_step(fake_tune):
    world, out = fake_tune
    assert _run_tune(out, "platform.launcher=slurm", "tune.strategy=bayes", "tune.budget=5", "tune.steps=[2]") == 0
    assert [len(labels) for _, labels in world.batches] == [1, 2, 2, 6]  # default; model's half; TPE's rest;
    # the confirmation's 3 pairs
    state = json.loads((out / "tune.json").read_text())
    ran = [t for t in state["steps"][0]["trials"] if t["status"] != "skipped"]
    assert ran[0]["params"] == {"stage": 1, "micro_batch_size": 4, "grad_acc_steps": 2}  # the anchor, first
    assert len(ran) == 4 and len({t["label"] for t in ran}) == 4  # + the default = the budget, none twice
    assert len(set(_launched_keys(world))) == len(world.launched)


def test_under_slurm_fixed_trials_join_the_steps_launch(fake_tune):
    world, out = fake_tune
    world.oom_mb = 10**6
    assert _run_tune(out, "platform=roce-h100", "platform.nodes=1", "platform.launcher=slurm", "tune.steps=[1,2]",
                     "tune.strategy=grid", "tune.stages=[1]", "tune.micro_batch_sizes=[2,4]") == 0
    assert [(step, len(labels)) for step, labels in world.batches][:3] == [(2, 1), (1, 7), (2, 2)]
    assert len(world.batches) == 4 and world.batches[3][0].startswith("confirm/")  # + the confirmation
    assert world.batches[1][1][0] == "default-env" and world.batches[2][1][0] == "default+nccl"
    state = json.loads((out / "tune.json").read_text())
    s1, s2 = state["steps"]
    assert s1["start"] == "default-env" and s1["trials"][0]["label"] == "default-env"
    assert s2["start"] == "default+nccl" and s2["trials"][0]["role"] == "default+nccl"
    # the default split with step 1's variables is the start point: measured once, never searched again
    assert [t["params"] for t in s2["trials"] if t["role"] == "search"] == [
        {"stage": 1, "micro_batch_size": 4, "grad_acc_steps": 2}]
    best = next(t for t in s1["trials"] if t["label"] == s1["best"])
    assert best["params"] == {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
