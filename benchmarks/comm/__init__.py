"""The collective benchmarks on a rank: the built-in sweep with nccl-tests semantics (collectives.py)
and its plain torch.distributed twin (plain_collective.py)."""
