"""Every record carries the machine it ran on, read from the system (issue 14; issue 16 uses the
same builder): the CPU's model name (not 'x86_64'), cores, memory, load; GPUs, topology and NICs
where they exist; and the declared-vs-detected hardware check."""
from __future__ import annotations

from benchmarks.machine import cpu_model


def test_every_record_carries_the_machine_read_from_the_system(default_suite):
    records = list(default_suite.records().values())
    assert records
    for rec in records:
        env = rec["environment"]
        box = env["machine"]
        assert box["cpu"]["model"] == cpu_model() and env["cpu_model"] == cpu_model(), rec["run_id"]
        assert box["cpu"]["logical_cpus"] >= 1 and box["cpu"]["mem_total_gib"] > 0
        assert len(box["cpu"]["load_avg_1_5_15"]) == 3
        assert isinstance(box["nics"], list) and box["gpus"] is None       # no nvidia-smi here
        assert env["gpu_count"] == 0 and env["hardware_mismatch"] == []     # cpu: no GPU declared
