"""The training workloads on a rank: the LLaMA pretraining and distillation loop (train.py) and its
plain twin (plain_loop.py), the model and its stack (model.py, stack.py, checkpoint_policy.py),
the batches (data.py), the teacher (distill.py) and the per-micro-step instrument (instrument.py)."""
