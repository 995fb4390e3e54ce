"""The collective vocabulary, in nccl-tests' semantics: the ops, the dtypes and reductions a sweep takes
(our names are torch's dtype names), nccl-tests' names for them, element sizes and binaries. The
harness validates and records with it; the ranks (benchmarks/comm/collectives.py) map it onto torch."""
from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "sendrecv")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
"""The dtypes a sweep (collective.dtype) takes: torch's names."""
REDOPS = ("sum", "prod", "max", "min", "avg")
SMALL_BYTES = 64 * 1024
"""The sizes whose time is the collective's latency, not its bandwidth: up to 64 KiB, where NCCL's LL and LL128
protocols carry a message and a ring's time is its hops' latency (nccl-tests' busbw there is a few GB/s at most)."""
LARGE_SPAN = 8
"""The sweep's largest sizes, from an eighth of its largest up (at 4x steps the top two, at 2x the top four): where a
fabric's bandwidth, not its latency, sets the time. Their busbw is the link's (large_busbw_gbps); nccl-tests'
average over every size also carries the latency-bound ones."""
NCCL_TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
              "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8", "float": "float",
              "half": "half", "double": "double", "uint32": "uint32", "uint64": "uint64"}
"""Our dtype names and nccl-tests' own -> nccl-tests' -d names (the `type` column it prints)."""
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8,
               "float64": 8}
BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
            "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf",
            "broadcast": "broadcast_perf", "reduce": "reduce_perf", "sendrecv": "sendrecv_perf"}
"""The nccl-tests binary of each op."""
