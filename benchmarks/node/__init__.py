"""The node a rank runs on: its machine and network (machine.py, network.py, gpu_state.py), the
capability probe (probe.py), the fingerprint as a rank sees it (environment.py), DeepSpeed's built
ops (ops.py) and the installed stack's smoke test (smoke_image.py)."""
