"""Launching a planned run: on this machine (local: torch.distributed.run or one process per rank), through
Slurm (slurm: submit, watch, read back; slurm_script: the batch scripts), inside a container image
(container), after the preflight checks of the ranks' environment (preflight)."""
