"""Activation checkpointing of every n-th decoder layer (workload.checkpoint_every_n_layers): the runner
checkpoints the layers the model counts (benchmarks/train.enable_checkpointing on a real transformers
LlamaForCausalLM), the recompute gives the same gradients, and the model's memory, FLOPs and
published cells follow the share of layers checkpointed."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from benchmarks.training.model import build_model
from benchmarks.training.train import enable_checkpointing
from harness.config.choices import CheckpointPolicy
from harness.errors import ConfigError
from harness.model.calibration import Calibration
from harness.model.flops import checkpointed_layers, recompute_flops_per_token, recompute_fraction
from harness.model.memory import activation_estimate, memory_estimate, selective_bytes_per_token
from harness.model.perfmodel import phase_flops, predict
from harness.model.text import describe
from harness.plan import model_spec, train_spec


def _at(cfg, ckpt: bool, every: int = 1):
    return dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, activation_checkpointing=ckpt,
                                                                 checkpoint_every_n_layers=every))


@pytest.mark.parametrize("layers", [1, 2, 5, 8])
@pytest.mark.parametrize("every", [1, 2, 3, 4])
def test_the_runner_checkpoints_the_layers_the_model_counts(tiny_cfg, layers, every):
    w = dataclasses.replace(tiny_cfg.workload, num_layers=layers, activation_checkpointing=True,
                            checkpoint_every_n_layers=every)
    flags = enable_checkpointing(build_model(model_spec(w)), SimpleNamespace(
        activation_checkpointing=True, checkpoint_every_n_layers=every, checkpoint_policy="full"))
    assert flags == [i % every == 0 for i in range(layers)]
    assert sum(flags) == checkpointed_layers(w) and recompute_fraction(w) == sum(flags) / layers
    off = enable_checkpointing(build_model(model_spec(w)), SimpleNamespace(
        activation_checkpointing=False, checkpoint_every_n_layers=1, checkpoint_policy="full"))
    assert off == [False] * layers and checkpointed_layers(dataclasses.replace(w, activation_checkpointing=False)) == 0


class _BeforeTheRename:
    """A model of transformers before 5.23 (a GPU node's own 5.17): gradient_checkpointing_enable of every
    layer, no activation_checkpointing_enable; l8b-kd stopped there on an H200 (AttributeError)."""

    def __init__(self, model):
        self._model = model

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self._model.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def __getattr__(self, name):
        if name == "activation_checkpointing_enable":
            raise AttributeError(name)
        return getattr(self._model, name)


@pytest.mark.parametrize("every", [1, 2, 3])
def test_transformers_before_the_rename_checkpoints_the_same_layers(tiny_cfg, every):
    w = dataclasses.replace(tiny_cfg.workload, num_layers=5)
    spec = SimpleNamespace(activation_checkpointing=True, checkpoint_every_n_layers=every, checkpoint_policy="full")
    old = _BeforeTheRename(build_model(model_spec(w)))
    assert not hasattr(old, "activation_checkpointing_enable")
    assert enable_checkpointing(old, spec) == enable_checkpointing(build_model(model_spec(w)), spec)
    assert enable_checkpointing(old, spec) == [i % every == 0 for i in range(5)]


def test_recomputing_every_other_layer_gives_the_same_gradients(tiny_cfg):
    w = tiny_cfg.workload
    batch = torch.randint(0, w.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    grads = []
    for ckpt, every in ((False, 1), (True, 2)):
        torch.manual_seed(0)
        model = build_model(model_spec(w))
        model.train()
        enable_checkpointing(model, SimpleNamespace(activation_checkpointing=ckpt, checkpoint_every_n_layers=every,
                                                    checkpoint_policy="full"))
        model(input_ids=batch, labels=batch).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


def _backward_mms(w, ckpt: bool, policy: str) -> tuple[int, list]:
    """aten.mm calls in backward (recompute included) of one step of a fresh model, and its gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func == torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = build_model(model_spec(w))
    model.train()
    enable_checkpointing(model, SimpleNamespace(activation_checkpointing=ckpt, checkpoint_every_n_layers=1,
                                                checkpoint_policy=policy))
    batch = torch.randint(0, w.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=batch, labels=batch).loss
    with Count():
        loss.backward()
    return Count.n, [p.grad.clone() for p in model.parameters()]


def test_the_selective_policy_recomputes_three_of_a_layers_seven_matmuls_as_the_model_counts(tiny_cfg):
    w = tiny_cfg.workload
    base, g0 = _backward_mms(w, False, "full")
    full, g1 = _backward_mms(w, True, "full")
    selective, g2 = _backward_mms(w, True, "selective")
    # full: the forward stops early, before down (its output is saved by nothing); selective: k, o, up
    assert (full - base, selective - base) == (6 * w.num_layers, 3 * w.num_layers)
    assert all(torch.allclose(a, b, atol=1e-6) and torch.allclose(a, c, atol=1e-6) for a, b, c in zip(g0, g1, g2))
    sel = dataclasses.replace(w, activation_checkpointing=True, checkpoint_policy=CheckpointPolicy.selective)
    h, kv = w.hidden_size, w.num_kv_heads * (w.hidden_size // w.num_heads)
    assert recompute_flops_per_token(sel) == 2 * w.num_layers * (h * kv + h * h + h * w.intermediate_size)
    full_w = dataclasses.replace(sel, checkpoint_policy=CheckpointPolicy.full)
    f = w.intermediate_size
    assert recompute_flops_per_token(full_w) == w.num_layers * (2 * (2 * h * h + 2 * h * kv + 2 * h * f) + 4 * h * w.seq_len)
    p = 4   # fp32
    assert activation_estimate(sel).stored_bytes > activation_estimate(full_w).stored_bytes
    assert selective_bytes_per_token(sel) == p * (4 * h + kv + w.intermediate_size) + 4 * w.num_heads


def test_the_spec_carries_it_and_a_config_refuses_it_without_checkpointing(tiny_cfg, composed):
    cfg = composed(["workload=llama-tiny", "workload.activation_checkpointing=true", "workload.checkpoint_every_n_layers=2"])
    assert train_spec(cfg, "r", {}).checkpoint_every_n_layers == 2
    assert "activation checkpointing on for 1 layer in 2" in describe(predict(cfg, Calibration()))
    with pytest.raises(ConfigError, match="workload.checkpoint_every_n_layers=2 is invalid: has no effect without"):
        composed(["workload=llama-tiny", "workload.checkpoint_every_n_layers=2"])
    with pytest.raises(ConfigError, match="workload.checkpoint_policy='selective' is invalid: has no effect without"):
        composed(["workload=llama-tiny", "workload.checkpoint_policy=selective"])
    sel = composed(["workload=llama-tiny", "workload.activation_checkpointing=true", "workload.checkpoint_policy=selective"])
    assert train_spec(sel, "r", {}).checkpoint_policy == "selective"
    assert "activation checkpointing on, selective" in describe(predict(sel, Calibration()))
    with pytest.raises(ConfigError, match="workload.checkpoint_every_n_layers=0 is invalid: must be >= 1"):
        composed(["workload=llama-tiny", "workload.activation_checkpointing=true", "workload.checkpoint_every_n_layers=0"])


def test_memory_and_recompute_fall_between_none_and_every_layer(composed):
    """llama-8b, 32 layers, seq 8192: every 2nd layer keeps 16 inputs and 16 full sets and recomputes 16
    forwards; the measured cpu runs (docs/performance-model.md) put peak and step time in the same order."""
    base = composed(["platform=roce-h100", "workload=llama-8b", "workload.seq_len=8192", "workload.samples_per_step=1",
                     "workload.micro_batch_size=1", "zero=stage3"])
    none, half, quarter, full = _at(base, False), _at(base, True, 2), _at(base, True, 4), _at(base, True, 1)
    stored = [activation_estimate(c.workload).stored_bytes for c in (none, quarter, half, full)]
    assert stored == sorted(stored, reverse=True) and len(set(stored)) == 4
    w, tokens = half.workload, 8192
    layer = activation_estimate(w).layer_bytes_per_token
    assert activation_estimate(w).stored_bytes == pytest.approx(
        (16 * 2 * w.hidden_size + 16 * layer + 4 * w.hidden_size + 2 * 2 * w.hidden_size) * tokens)
    recompute = [phase_flops(c)["backward"] - phase_flops(none)["backward"] for c in (quarter, half, full)]
    assert recompute == pytest.approx([recompute[2] * f for f in (8 / 32, 16 / 32, 1.0)])
    assert 0.7 * phase_flops(none)["forward"] < recompute[2] < phase_flops(none)["forward"]   # no head, no down
    assert [memory_estimate(c).fits for c in (none, half, full)] == [False, True, True]
    steps = [predict(c, Calibration()).step_time_s for c in (none, quarter, half, full)]
    assert steps[1] < steps[2] < steps[3]


def test_a_sweep_with_checkpointing_tries_each_choice_and_names_the_fastest_that_fits(composed, capsys):
    """llama-8b at seq 8192 on 16 x 8 H100s (C 16): sharded 128 ways, ZeRO-3 fits without checkpointing
    and beats every checkpointed row (docs/performance-model.md)."""
    from harness.__main__ import main
    from harness.model.sweep import CHECKPOINTING_CHOICES, fastest, sweep_configs

    cfg = composed(["platform=roce-h100", "platform.name=user-h100", "platform.nodes=16", "workload=llama-8b",
                    "workload.seq_len=8192", "workload.samples_per_step=16", "workload.micro_batch_size=1"])
    configs = sweep_configs(cfg, checkpointing=True)
    assert len(configs) == 3 * 5 * len(CHECKPOINTING_CHOICES)         # stages x splits of 16 x choices
    assert {(c.workload.activation_checkpointing, c.workload.checkpoint_every_n_layers, c.workload.checkpoint_policy.value)
            for c in configs} == set(CHECKPOINTING_CHOICES)
    preds = [predict(c, Calibration()) for c in configs]
    best = fastest(preds)
    assert best.memory.fits and best.step_time_s == min(p.step_time_s for p in preds if p.memory.fits)
    assert (best.config["zero_stage"], best.config["activation_checkpointing"]) == (3, False)
    assert main(["model", "--sweep", "--checkpointing", "workload=llama-tiny"]) == 0
    out = capsys.readouterr().out
    assert "checkpointing" in out.splitlines()[1] and "on for 1 layer in 2" in out and "fastest that fits: ZeRO-" in out
    assert main(["model", "--checkpointing", "workload=llama-tiny"]) == 2
    assert "--checkpointing widens a --sweep" in capsys.readouterr().err
