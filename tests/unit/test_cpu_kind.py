"""Which CPU a record ran on (benchmarks/node/machine.py cpu_id, cpu_kind): a cloud VM's model name ('AMD
EPYC') and its probe's ISA class ('AVX512 +avx512_bf16') are the same on two generations of silicon that run
the suite 1.4-1.6x apart. The record keeps the CPU's family, model, stepping and microcode; two kinds are two
machines (named in the verdict, each its own references and baseline), a record kept before the kind proves
nothing either way, and a stepping or microcode that moved is named in "what changed". Real inputs: this
repository's cpuinfo of a 2-core Zen 5 EPYC VM (tests/data/cpuinfo/), the AVX-512 EPYC's records of
2026-12-03 (reference_results/sources/cpu-avx512-epyc/, kept before the kind)."""
from __future__ import annotations

import copy
import json

from unit_helpers import REPO_ROOT, typed

from benchmarks.node.machine import cpu_id, cpu_kind
from harness.model.calibration import of_machine
from harness.record import ResultRecord
from harness.verdict.baseline import machine_key
from harness.verdict.changes import environment_diff
from harness.verdict.compare import compare
from harness.verdict.cross_machine import machine_name, machines_apart, names_agree, without_kind
from harness.verdict.references import references_from_records

ZEN5 = (REPO_ROOT / "tests" / "data" / "cpuinfo" / "epyc-family26.txt").read_text(encoding="utf-8")
# /proc/cpuinfo's first processor of an Arm Neoverse V2 host (the kernel's field names; no model name)
NEOVERSE = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

processor\t: 1
CPU implementer\t: 0x42
"""
AVX512_RUN = REPO_ROOT / "reference_results" / "sources" / "cpu-avx512-epyc" / "2026-12-03" / "s3" / "01-z1-mb2-ga4.json"


def avx512_record() -> dict:
    """A real llama-tiny record of the AVX-512 EPYC, written before the CPU's id was kept."""
    return json.loads(AVX512_RUN.read_text(encoding="utf-8"))


def with_id(rec: dict, **ident) -> dict:
    """The record as if its machine had kept the CPU's id (the Zen 5's, with `ident` laid over)."""
    out = copy.deepcopy(rec)
    env = out["environment"]
    for machine in [env["machine"]] + [n["machine"] for n in env.get("nodes") or []]:   # rank 0's, each node's
        machine["cpu"]["id"] = {**cpu_id(ZEN5), **ident}
    return out


def test_the_cpus_id_is_read_from_the_first_processor_of_cpuinfo():
    assert cpu_id(ZEN5) == {"vendor": "AuthenticAMD", "family": 26, "model": 2, "stepping": 1,
                            "microcode": "0x1000065"}
    assert cpu_kind({"id": cpu_id(ZEN5)}) == "family 26 model 2"
    arm = cpu_id(NEOVERSE)
    assert arm == {"implementer": "0x41", "architecture": 8, "variant": "0x0", "part": "0xd4f", "revision": 0}
    assert cpu_kind({"id": arm}) == "implementer 0x41 part 0xd4f"   # the second processor's implementer unread
    assert cpu_id("processor : 0\nmodel name : QEMU Virtual CPU\n") is None
    assert cpu_kind({"model": "AMD EPYC"}) is None and cpu_kind(None) is None   # a record from before


def test_the_kind_joins_a_cpu_machines_name_and_a_name_without_it_may_be_either_kind():
    before, zen5 = avx512_record()["environment"], with_id(avx512_record())["environment"]
    assert machine_name(before, "cpu") == "AMD EPYC (2 CPUs, AVX512 +avx512_bf16)"
    assert machine_name(zen5, "cpu") == "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2)"
    assert without_kind(machine_name(zen5, "cpu")) == machine_name(before, "cpu")
    zen4 = "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 25 model 17)"
    assert names_agree(machine_name(zen5, "cpu"), machine_name(before, "cpu"))
    assert not names_agree(machine_name(zen5, "cpu"), zen4)
    assert not names_agree(machine_name(before, "cpu"), "AMD EPYC (2 CPUs, AVX2)")


def test_two_kinds_under_one_cpu_name_are_two_machines_and_a_record_without_its_kind_proves_nothing():
    zen5, zen4 = with_id(avx512_record()), with_id(avx512_record(), family=25, model=17)
    why = machines_apart(zen4["environment"], zen5["environment"])
    assert why == ("not comparable: reference taken on AMD EPYC (2 CPUs) of family 25 model 17, "
                   "this run on family 26 model 2")
    assert machines_apart(avx512_record()["environment"], zen5["environment"]) is None
    assert machines_apart(zen5["environment"], avx512_record()["environment"]) is None
    assert machines_apart(with_id(avx512_record(), stepping=2)["environment"], zen5["environment"]) is None


def test_a_moved_stepping_or_microcode_is_named_and_a_reference_without_the_id_names_nothing_of_it():
    zen5 = with_id(avx512_record())
    patched = with_id(avx512_record(), microcode="0x1000070", stepping=2)
    diff = environment_diff(zen5["environment"], patched["environment"])
    assert diff["machine.vm.cpu_microcode"] == ["0x1000065", "0x1000070"]
    assert diff["machine.vm.cpu_stepping"] == [1, 2]
    assert list(diff)[:2] == ["machine.vm.cpu_microcode", "machine.vm.cpu_stepping"], "the machine first"
    other = environment_diff(with_id(avx512_record(), family=25, model=17)["environment"], zen5["environment"])
    assert other["machine.vm.cpu_kind"] == ["family 25 model 17", "family 26 model 2"]
    assert not any(k.startswith("machine.") for k in environment_diff(avx512_record()["environment"],
                                                                       zen5["environment"]))


def test_each_kind_keeps_its_own_baseline_and_the_models_entries_prefer_the_own_kinds():
    zen5, zen4 = with_id(avx512_record()), with_id(avx512_record(), family=25, model=17)
    keys = {machine_key(typed([r])) for r in (zen5, zen4, avx512_record())}
    assert len(keys) == 3, keys
    refs = {name: references_from_records([ResultRecord.from_dict(r)], source="s", submitter="t", date="d",
                                          system="x", tolerance_pct={"default": 10.0})
            for name, r in (("zen5", zen5), ("before", avx512_record()), ("avx2", avx2_like()))}
    table = refs["zen5"] + refs["before"] + refs["avx2"]
    here = machine_name(zen5["environment"], "cpu")
    mine, words = of_machine(table, here)
    assert mine == refs["zen5"] and "of this machine" in words
    zen4_name = machine_name(zen4["environment"], "cpu")
    mine, words = of_machine(table, zen4_name)   # no entry of its kind: those kept before the kind
    assert mine == refs["before"] and zen4_name in words


def avx2_like() -> dict:
    """The AVX-512 EPYC's record as an AVX2 box's (its probe's ISA class): another machine by name."""
    rec = avx512_record()
    env = rec["environment"]
    for machine in [env["machine"]] + [n["machine"] for n in env.get("nodes") or []]:
        machine["probe"]["isa"]["class"] = "AVX2"
    return rec


def test_a_run_is_judged_by_its_own_kinds_reference_where_the_table_also_holds_one_kept_before_the_kind():
    zen5, zen4 = with_id(avx512_record()), with_id(avx512_record(), family=25, model=17)
    faster = copy.deepcopy(zen5)
    faster["metrics"]["samples_per_s"]["value"] *= 1.5   # the Zen 5's own figure, apart from the older one's
    table = [r for rec in (avx512_record(), faster) for r in references_from_records(
        [ResultRecord.from_dict(rec)], source="s", submitter="t", date="d", system="x", tolerance_pct={"default": 10.0})
        if r.metric == "samples_per_s"]

    def judged_by(run: dict, refs: list) -> float:
        return next(v for v in compare(typed([run]), refs) if v.metric == "samples_per_s").reference
    for refs in (table, table[::-1]):   # whatever the table's order
        assert judged_by(with_id(faster), refs) == faster["metrics"]["samples_per_s"]["value"]
        assert judged_by(zen4, refs) == avx512_record()["metrics"]["samples_per_s"]["value"]   # the Zen 5's is apart
        assert judged_by(avx512_record(), refs) == avx512_record()["metrics"]["samples_per_s"]["value"]


def test_a_gpu_nodes_host_cpu_is_named_in_what_changed_and_never_parts_the_gpus():
    """The one-GPU nodes' hosts read 'Intel(R) Xeon(R) Processor' whatever their generation, and two such
    hosts ran ZeRO-1 mb 8's forward phase in 38.1 and 23.5 ms beside equal GPU figures: the host's kind is
    named in "what changed" (a real H100 gpu-check record, its host's id laid in), the GPUs name the machine."""
    rec = json.loads((REPO_ROOT / "reference_results" / "sources" / "gpu-runs" / "2026-11-27-h100" / "gpu-check"
                      / "02-z1.json").read_text(encoding="utf-8"))
    spr = with_id(rec, vendor="GenuineIntel", family=6, model=143, stepping=8, microcode="0x2b000603")
    emr = with_id(rec, vendor="GenuineIntel", family=6, model=207, stepping=2, microcode="0x21000283")
    diff = environment_diff(spr["environment"], emr["environment"])
    assert diff["machine.vm.cpu_kind"] == ["family 6 model 143", "family 6 model 207"]
    assert machines_apart(spr["environment"], emr["environment"]) is None
    assert machine_name(emr["environment"], "h100") == machine_name(rec["environment"], "h100") == "H100 80GB HBM3"
