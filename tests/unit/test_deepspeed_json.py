"""The DeepSpeed JSON a run ran is in its fingerprint (environment.deepspeed_json, flattened), and a comparison
names each key that differs: a user's deepspeed_config= is not part of the reference key, so a debugging
flag left on (memory_breakdown: llama-tiny 13x slower on cpu) would otherwise slow a run unnamed."""
from __future__ import annotations

from contract.fingerprint import flat_json
from harness.verdict.changes import deepspeed_diff, environment_diff

DS = {"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "offload_optimizer": {}},
      "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.95], "lr": 1e-4}}}


def test_the_json_is_flattened_to_dotted_keys_a_list_as_its_text():
    assert flat_json(DS) == {"bf16.enabled": True, "optimizer.params.betas": "[0.9,0.95]", "optimizer.params.lr": 1e-4,
                             "optimizer.type": "AdamW", "train_batch_size": 16, "zero_optimization.offload_optimizer": {},
                             "zero_optimization.stage": 3}
    assert flat_json({}) == {}


def test_each_key_that_differs_is_named_and_a_record_without_the_field_says_nothing():
    old, new = flat_json(DS), flat_json({**DS, "memory_breakdown": True, "bf16": {"enabled": True}})
    assert deepspeed_diff(old, new) == {"deepspeed.memory_breakdown": [None, True]}
    assert deepspeed_diff(old, old) == {} and deepspeed_diff(None, new) == {} and deepspeed_diff(old, None) == {}
    timers = flat_json({**DS, "timers": {"throughput": {"synchronized": False}}})
    assert deepspeed_diff(old, timers) == {"deepspeed.timers.throughput.synchronized": [None, False]}


def test_a_comparison_names_it_beside_the_libraries():
    env = {"torch": "2.13.0+cpu", "deepspeed": "0.19.8", "deepspeed_json": flat_json(DS)}
    changed = {**env, "deepspeed": "0.19.7", "deepspeed_json": flat_json({**DS, "memory_breakdown": True})}
    diff = environment_diff(env, changed)
    assert diff["deepspeed"] == ["0.19.8", "0.19.7"] and diff["deepspeed.memory_breakdown"] == [None, True]
    assert "deepspeed.memory_breakdown" not in environment_diff({k: v for k, v in env.items() if k != "deepspeed_json"},
                                                                changed)
