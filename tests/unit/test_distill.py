"""Knowledge distillation: the loss against a float64 reference computed by hand, the frozen
teacher (eval, no gradients, its dtype, checkpoint loading), the FLOP count of its forward, and
the parameter counts of both 8B models built on the meta device."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from benchmarks.training.distill import IGNORE_INDEX, build_teacher, distillation_loss, teacher_deepspeed_config
from benchmarks.training.model import build_model, count_params_meta, initialise, parameter_seed
from contract.spec import DistillSpec
from harness.config.teacher import llama_param_shapes, teacher_workload
from harness.model.flops import TEACHER_FLOPS_FORMULA, forward_flops_per_token, llama_param_count
from harness.plan import model_spec

# --- the loss against a reference written out by hand, in float64 --------------------------------

def reference_loss(student, teacher, labels, alpha, temperature, ignore_index=IGNORE_INDEX):
    """(1 - alpha) CE + alpha T^2 KL(teacher || student) averaged over the valid next-token
    positions, with plain Python floats (IEEE double) and explicit sums: no torch op involved."""
    ce_sum = kl_sum = 0.0
    count = 0
    for b in range(len(labels)):
        for i in range(len(labels[b]) - 1):
            y = labels[b][i + 1]
            if y == ignore_index:
                continue
            s, t = student[b][i], teacher[b][i]
            log_z = math.log(sum(math.exp(x) for x in s))
            ce_sum += log_z - s[y]
            st = [x / temperature for x in s]
            tt = [x / temperature for x in t]
            log_zs = math.log(sum(math.exp(x) for x in st))
            log_zt = math.log(sum(math.exp(x) for x in tt))
            kl_sum += sum(math.exp(tt[v] - log_zt) * ((tt[v] - log_zt) - (st[v] - log_zs))
                          for v in range(len(s)))
            count += 1
    ce, kl = ce_sum / count, kl_sum / count
    return (1 - alpha) * ce + alpha * temperature ** 2 * kl, ce, kl


def tiny_example(seed=0, batch=2, seq=5, vocab=7, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    student = (torch.randn(batch, seq, vocab, generator=gen) * 3).to(dtype)
    teacher = (torch.randn(batch, seq, vocab, generator=gen) * 3).to(dtype)
    labels = torch.randint(0, vocab, (batch, seq), generator=gen)
    return student, teacher, labels


@pytest.mark.parametrize("alpha,temperature", [(0.5, 2.0), (0.0, 1.0), (1.0, 4.0), (0.3, 0.5)])
def test_loss_equals_the_float64_reference(alpha, temperature):
    student, teacher, labels = tiny_example()
    labels[0, 3] = IGNORE_INDEX  # a padded position: excluded from both terms
    labels[1, 1] = IGNORE_INDEX
    got = distillation_loss(student, teacher, labels, alpha, temperature)
    want, ce, kl = reference_loss(student.tolist(), teacher.tolist(), labels.tolist(), alpha, temperature)
    assert got.loss.dtype == torch.float64
    assert got.num_tokens == 2 * 4 - 2
    assert float(got.loss) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert float(got.ce) == pytest.approx(ce, rel=1e-12)
    assert float(got.kl) == pytest.approx(kl, rel=1e-12, abs=1e-15)


def test_low_precision_logits_are_computed_in_float32_close_to_the_reference():
    student, teacher, labels = tiny_example(seed=3)
    got = distillation_loss(student.bfloat16(), teacher.bfloat16(), labels, 0.5, 2.0)
    assert got.loss.dtype == torch.float32
    want, _, _ = reference_loss(student.bfloat16().double().tolist(), teacher.bfloat16().double().tolist(),
                                labels.tolist(), 0.5, 2.0)
    assert float(got.loss) == pytest.approx(want, rel=1e-5)


def test_alpha_zero_is_the_models_own_causal_lm_loss():
    """With alpha = 0 the loss is exactly transformers' shifted cross-entropy."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    student, teacher, labels = tiny_example(seed=5, dtype=torch.float32)  # transformers computes in float32
    labels[1, 2] = IGNORE_INDEX
    got = distillation_loss(student, teacher, labels, alpha=0.0, temperature=3.0)
    hf = ForCausalLMLoss(student, labels, vocab_size=student.shape[-1])
    assert float(got.loss) == pytest.approx(float(hf), rel=1e-6)


def test_kl_is_zero_when_the_student_is_the_teacher_and_the_gradient_points_to_it():
    student, _, labels = tiny_example(seed=7)
    same = distillation_loss(student, student.clone(), labels, alpha=1.0, temperature=2.0)
    assert abs(float(same.kl)) < 1e-12 and float(same.loss) == pytest.approx(0.0, abs=1e-12)
    s = student.clone().requires_grad_(True)
    teacher = student + torch.randn_like(student)
    distillation_loss(s, teacher, labels, alpha=1.0, temperature=2.0).loss.backward()
    # the last position predicts nothing (no next token): no gradient flows to it
    assert torch.all(s.grad[:, -1] == 0)
    assert s.grad[:, :-1].abs().sum() > 0
    # the teacher's logits are data, never differentiated
    assert not teacher.requires_grad


def test_no_valid_token_gives_a_zero_loss_not_nan():
    student, teacher, labels = tiny_example()
    labels[:] = IGNORE_INDEX
    got = distillation_loss(student, teacher, labels, 0.5, 2.0)
    assert got.num_tokens == 0 and float(got.loss) == 0.0


def test_different_vocabularies_are_refused():
    student, teacher, labels = tiny_example()
    with pytest.raises(ValueError, match="vocabularies must be the same"):
        distillation_loss(student, teacher[..., :-1], labels, 0.5, 2.0)


# --- the teacher --------------------------------------------------------------------------------

def distill_spec(w, checkpoint=None, precision="bf16") -> DistillSpec:
    from pathlib import Path

    from harness.config.teacher import checkpoint_files

    files = [str(f) for f in checkpoint_files(Path(checkpoint))] if checkpoint else []
    return DistillSpec(alpha=0.5, temperature=2.0, teacher=model_spec(w), teacher_precision=precision,
                       teacher_checkpoint=checkpoint, teacher_files=files)


def test_a_replica_teacher_is_frozen_in_eval_mode_in_its_own_dtype(composed):
    w = teacher_workload(composed(["workload=llama-tiny-kd"]).workload)
    student_ds = {"zero_optimization": {"stage": 2}}
    rng = torch.random.get_rng_state()
    teacher = build_teacher(distill_spec(w), student_ds, torch.device("cpu"), seed=1234)
    assert torch.equal(torch.random.get_rng_state(), rng), "the student's random stream is untouched"
    assert teacher.placement == "replica"
    model = teacher.module
    assert not model.training
    assert all(not p.requires_grad and p.dtype == torch.bfloat16 for p in model.parameters())
    assert teacher.num_params == llama_param_count(w)
    assert teacher.bytes_per_rank == 2 * teacher.num_params
    logits = teacher.logits(torch.randint(0, w.vocab_size, (2, 16)))
    assert logits.shape == (2, 16, w.vocab_size) and logits.grad_fn is None
    # seed + offset: not the student's initialisation
    student = build_model(model_spec(w))
    initialise(student, 1234, zero3=False)
    assert not torch.equal(student.model.embed_tokens.weight.bfloat16(), model.model.embed_tokens.weight)


def test_initialisation_is_transformers_scheme_drawn_per_parameter_name(composed):
    """Per-name seeds: the same values whatever the build order or placement (ZeRO-3 gathers each
    parameter and rank 0 draws it with the same generator; see the integration tests)."""
    w = composed(["workload=llama-tiny"]).workload
    a, b = build_model(model_spec(w)), build_model(model_spec(w))
    torch.manual_seed(0)
    initialise(a, 7, zero3=False)
    torch.manual_seed(1)  # the global stream plays no part
    initialise(b, 7, zero3=False)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
        if p.ndim == 1:
            assert torch.all(p == 1), name  # RMSNorm scales
        else:
            assert float(p.detach().std()) == pytest.approx(a.config.initializer_range, rel=0.05), name
    embed = a.model.embed_tokens.weight
    assert not torch.equal(embed[:4, :4], a.lm_head.weight[:4, :4]), "each parameter has its own seed"
    initialise(b, 8, zero3=False)
    assert not torch.equal(embed, b.model.embed_tokens.weight)
    assert parameter_seed(7, "x") == parameter_seed(7, "x") != parameter_seed(7, "y")


def test_a_replica_teacher_loads_its_checkpoint(composed, tmp_path):
    w = teacher_workload(composed(["workload=llama-tiny-kd"]).workload)
    torch.manual_seed(99)
    source = build_model(model_spec(w))
    source.save_pretrained(tmp_path / "teacher")
    teacher = build_teacher(distill_spec(w, str(tmp_path / "teacher"), "fp32"),
                            {"zero_optimization": {"stage": 1}}, torch.device("cpu"), seed=1234)
    loaded = dict(teacher.module.named_parameters())
    for name, p in source.named_parameters():
        assert torch.equal(loaded[name], p), name
    tokens = torch.randint(0, w.vocab_size, (1, 8))
    with torch.no_grad():
        assert torch.allclose(teacher.logits(tokens), source(input_ids=tokens).logits)


def test_the_zero3_teacher_engine_config_keeps_the_students_zero3_knobs_and_has_no_optimizer():
    student = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "train_batch_size": 16,
               "gradient_clipping": 1.0, "optimizer": {"type": "AdamW"},
               "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    ds = teacher_deepspeed_config(student, "bf16")
    assert ds["zero_optimization"] == student["zero_optimization"]
    assert ds["zero_optimization"] is not student["zero_optimization"]
    assert ds["bf16"] == {"enabled": True} and "optimizer" not in ds and "gradient_clipping" not in ds
    assert ds["train_batch_size"] == 16
    assert "bf16" not in teacher_deepspeed_config(student, "fp32")


# --- FLOPs and parameter counts -------------------------------------------------------------------

def test_teacher_forward_flops_are_2n_plus_4lhs(composed):
    w = composed(["workload=llama-8b-kd", "platform=h100"]).workload
    t = teacher_workload(w)
    fm = forward_flops_per_token(t, llama_param_count(t))
    n = llama_param_count(t) - t.vocab_size * t.hidden_size  # the input embedding is a lookup
    assert fm.formula == TEACHER_FLOPS_FORMULA == "2*N_t + 4*L_t*h_t*s"
    assert t.seq_len == w.seq_len == 128  # the teacher sees the student's sequences
    assert fm.flops_per_token == 2 * n + 4 * 32 * 4096 * 128


def test_both_8b_models_of_llama_8b_kd_have_8_030_261_248_parameters_on_the_meta_device(composed):
    w = composed(["workload=llama-8b-kd", "platform=h100"]).workload
    student, teacher = model_spec(w), model_spec(teacher_workload(w))
    assert count_params_meta(student) == 8_030_261_248
    assert count_params_meta(teacher) == 8_030_261_248
    assert llama_param_count(teacher_workload(w)) == 8_030_261_248


@pytest.mark.parametrize("workload,overrides", [
    ("llama-8b-kd", []),
    ("llama-tiny-kd", ["workload.distill.teacher.num_layers=2", "workload.distill.teacher.hidden_size=128",
                       "workload.distill.teacher.num_kv_heads=4"]),
    ("llama-tiny-kd", ["workload.tie_embeddings=true"]),
])
def test_checkpoint_shapes_are_the_real_models_state_dict(composed, workload, overrides):
    """The shapes a checkpoint is checked against are exactly the transformers model's."""
    platform = ["platform=h100"] if "8b" in workload else []
    t = teacher_workload(composed([f"workload={workload}", *platform, *overrides]).workload)
    model = build_model(model_spec(t), device="meta")
    real = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert llama_param_shapes(t) == real
    assert sum(math.prod(s) for s in real.values()) == llama_param_count(t)


def test_a_teacher_of_another_shape_changes_the_teacher_only(composed):
    w = composed(["workload=llama-tiny-kd", "workload.distill.teacher.num_layers=6"]).workload
    t = teacher_workload(w)
    assert (t.num_layers, w.num_layers) == (6, 4)
    assert dataclasses.replace(t, num_layers=4, name=w.name, precision=w.precision, distill=w.distill) == w


@pytest.mark.parametrize("chunk_elements", [7, 7 * 3, 7 * 4, 10**9], ids=["1-token", "3-tokens", "4-tokens", "whole"])
def test_the_blockwise_loss_and_its_gradient_equal_the_whole_computation(chunk_elements):
    """Blocks of tokens (vocab 7), each recomputed in backward: the same loss and gradient as one block."""
    student, teacher, labels = tiny_example(seed=11)
    labels[1, 2] = IGNORE_INDEX
    want, _, _ = reference_loss(student.tolist(), teacher.tolist(), labels.tolist(), 0.4, 1.5)
    grads = []
    for elements in (chunk_elements, 10**9):
        s = student.clone().requires_grad_(True)
        got = distillation_loss(s, teacher, labels, 0.4, 1.5, chunk_elements=elements)
        assert float(got.loss.detach()) == pytest.approx(want, rel=1e-12)
        got.loss.backward()
        grads.append(s.grad)
    assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-15)


def test_the_8b_vocabulary_is_split_into_blocks_of_a_quarter_gibibyte():
    from benchmarks.training.distill import CHUNK_ELEMENTS

    rows = CHUNK_ELEMENTS // 128256
    assert rows == 523 and rows * 128256 * 4 <= 2**28
    assert CHUNK_ELEMENTS // 4096 >= 4 * 128, "llama-tiny-kd's micro-batch is one block"
