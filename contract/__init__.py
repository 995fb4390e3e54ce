"""The contract between the controller (harness/) and the ranks (benchmarks/): what one reads of the other.

Torch-free and importing neither side, so both import it: the run spec a rank reads (spec), the
events it writes (events), the collective vocabulary (collectives) and the metric registry (metrics).
"""
