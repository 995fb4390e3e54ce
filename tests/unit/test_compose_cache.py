"""compose() keeps Hydra's compositions of the group choices (one costs 0.2-0.6 s; a tune, a plan or
the model's sweep composes the same ones again), in the process and on disk for the next one, and
applies the value overrides to a copy: each caller gets its own object, and what a composition reads
besides its overrides (every file under conf/, the variables conf/ interpolates, and on disk the
schema's source and the libraries' versions) is part of its key, so an installed preset, an edited
file, another variable or an edited schema is composed afresh. A cache file that cannot be read or
written is never an error."""
from __future__ import annotations

import os
import shutil

import pytest
from unit_helpers import CONF_DIR

import harness.config.compose as composition
from harness.config.compose import compose
from harness.errors import ConfigError


@pytest.fixture
def conf(tmp_path, monkeypatch):
    """A private copy of conf/ that compose() reads, with nothing kept from before."""
    copy = tmp_path / "conf"
    shutil.copytree(CONF_DIR, copy)
    monkeypatch.setattr(composition, "CONF_DIR", copy)
    monkeypatch.setattr(composition, "_NODES", type(composition._NODES)())
    monkeypatch.setattr(composition, "DISK_CACHE", tmp_path / "compose-cache")
    return copy


def next_process(monkeypatch) -> None:
    """What a new process starts with: nothing kept in memory, the disk cache as it is."""
    monkeypatch.setattr(composition, "_NODES", type(composition._NODES)())
    monkeypatch.setattr(composition, "_CODE_KEY", None)


def hydra_calls(monkeypatch) -> list:
    """The override lists Hydra composes whole from now on."""
    calls: list = []
    real = composition._hydra_node

    def counted(overrides, *args, **kwargs):
        calls.append(list(overrides))
        return real(overrides, *args, **kwargs)

    monkeypatch.setattr(composition, "_hydra_node", counted)
    return calls


def test_the_same_group_choices_are_composed_once_and_each_caller_gets_its_own_config(conf, monkeypatch):
    calls = hydra_calls(monkeypatch)
    first = compose(["zero=stage2", "workload.micro_batch_size=4"])
    first.workload.micro_batch_size = 999
    first.platform.nccl_env["NCCL_ALGO"] = "Ring"
    second = compose(["zero=stage2", "workload.micro_batch_size=4"])
    assert calls == [["zero=stage2"]]
    assert second.workload.micro_batch_size == 4 and "NCCL_ALGO" not in second.platform.nccl_env
    assert second is not first and second.workload is not first.workload
    assert compose(["workload.micro_batch_size=2", "zero=stage2"]).workload.micro_batch_size == 2
    assert len(calls) == 1                  # another value: no composition
    assert compose(["zero=stage3", "workload.micro_batch_size=2"]).zero.stage == 3
    assert len(calls) == 2                  # another group choice: one


def test_a_file_added_or_edited_under_conf_is_composed_afresh(conf, monkeypatch):
    calls = hydra_calls(monkeypatch)
    preset = conf / "suite" / "tuned-test.yaml"
    with pytest.raises(ConfigError, match="tuned-test"):
        compose(["suite=tuned-test"])
    runs = "runs:\n  - {name: %s, overrides: [workload=llama-tiny]}\n"
    preset.write_text("defaults:\n  - suite_schema\nname: tuned-test\n" + runs % "first")
    assert [r.name for r in compose(["suite=tuned-test"]).suite.runs] == ["first"]
    preset.write_text("defaults:\n  - suite_schema\nname: tuned-test\n" + runs % "other")   # same size
    assert [r.name for r in compose(["suite=tuned-test"]).suite.runs] == ["other"]
    assert len(calls) == 3      # the failed composition is never kept


def test_a_variable_that_conf_interpolates_is_part_of_the_key(conf, monkeypatch):
    calls = hydra_calls(monkeypatch)
    monkeypatch.setenv("SUITE_CLUSTER", "pm")
    assert compose(["platform=cpu-cluster"]).platform.slurm.client_prefix[0].endswith("/pm/client")
    monkeypatch.setenv("SUITE_CLUSTER", "other")
    assert compose(["platform=cpu-cluster"]).platform.slurm.client_prefix[0].endswith("/other/client")
    monkeypatch.setenv("SOME_VARIABLE_CONF_NEVER_READS", "1")
    compose(["platform=cpu-cluster"])
    assert len(calls) == 2


def test_the_next_process_reads_the_composition_from_disk_and_gets_the_same_config(conf, monkeypatch):
    calls = hydra_calls(monkeypatch)
    first = compose(["suite=default-cpu", "zero=stage3", "workload.micro_batch_size=4"])
    assert len(list(composition.DISK_CACHE.glob("*.pickle"))) == 1
    next_process(monkeypatch)
    again = compose(["suite=default-cpu", "zero=stage3", "workload.micro_batch_size=4"])
    assert calls == [["suite=default-cpu", "zero=stage3"]] and again == first
    assert compose(["suite=default-cpu", "zero=stage3", "workload.micro_batch_size=2"]).workload.micro_batch_size == 2
    assert len(calls) == 1


def test_an_edited_conf_file_or_schema_is_composed_afresh_by_the_next_process(conf, monkeypatch, tmp_path):
    calls = hydra_calls(monkeypatch)
    compose(["zero=stage2"])
    zero2 = conf / "zero" / "stage2.yaml"
    zero2.write_text(zero2.read_text().replace("stage: 2", "stage: 2\noverlap_comm: false"))
    next_process(monkeypatch)
    assert compose(["zero=stage2"]).zero.overlap_comm is False and len(calls) == 2
    next_process(monkeypatch)    # the schema's source: another copy of harness/config/ with one more byte
    code = tmp_path / "config"
    shutil.copytree(os.path.dirname(composition.__file__), code)
    (code / "schema.py").write_text((code / "schema.py").read_text() + "\n")
    monkeypatch.setattr(composition, "__file__", str(code / "compose.py"))
    compose(["zero=stage2"])
    assert len(calls) == 3
    next_process(monkeypatch)
    compose(["zero=stage2"])
    assert len(calls) == 3 and len(list(composition.DISK_CACHE.glob("*.pickle"))) == 3


def test_an_unreadable_or_unwritable_cache_composes_as_before(conf, monkeypatch, tmp_path):
    calls = hydra_calls(monkeypatch)
    expected = compose(["zero=stage1"])
    (kept,) = composition.DISK_CACHE.glob("*.pickle")
    kept.write_bytes(kept.read_bytes()[:100])           # truncated (a disk full, a crash)
    next_process(monkeypatch)
    assert compose(["zero=stage1"]) == expected and len(calls) == 2
    next_process(monkeypatch)
    assert compose(["zero=stage1"]) == expected and len(calls) == 2     # rewritten whole
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(composition, "DISK_CACHE", blocked / "compose")  # cannot be made
    next_process(monkeypatch)
    assert compose(["zero=stage1"]) == expected and len(calls) == 3
    assert compose(["zero=stage1"]) == expected and len(calls) == 3     # kept in memory
    assert not list(tmp_path.glob("**/.*.tmp"))


def test_the_disk_cache_keeps_the_most_recently_used_files(conf, monkeypatch):
    monkeypatch.setattr(composition, "DISK_CACHE_MAX", 2)
    calls = hydra_calls(monkeypatch)
    compose(["zero=stage1"])
    compose(["zero=stage2"])
    stage2, _ = composition._disk_entry((("zero=stage2",), composition._conf_key()))
    os.utime(stage2, (1, 1))                            # the least recently used
    compose(["zero=stage3"])
    assert len(list(composition.DISK_CACHE.glob("*.pickle"))) == 2 and not stage2.exists()
    next_process(monkeypatch)
    compose(["zero=stage1"])
    compose(["zero=stage3"])
    assert len(calls) == 3


def _suite_lines() -> list[list[str]]:
    """Each suite of conf/ with the overrides of up to two of its runs (what plan composes)."""
    import yaml

    lines = []
    for path in sorted((CONF_DIR / "suite").glob("*.yaml")):
        runs = (yaml.safe_load(path.read_text()) or {}).get("runs") or []
        lines += [[f"suite={path.stem}", *run.get("overrides", [])] for run in runs[:2]]
    return lines


SPLIT_CASES = [
    ["suite=single", "zero=stage3", "workload.micro_batch_size=2", "workload.grad_acc_steps=4"],
    ["workload.micro_batch_size=2", "suite=single", "zero=stage2", "tune.checkpointing=[none,every_2]"],
    ["platform=roce-h100", "platform.nodes=16", "workload=llama-8b", "workload.seq_len=8192", "suite=single"],
    ["platform=h100", "workload=llama-440m", "workload.compile=torch", "suite=single"],
    ["+nccl_env={NCCL_ALGO: Ring}", "suite=single"],
    ["nccl_env={NCCL_ALGO: Ring}", "suite=single"],
    ["workload.micro_batch_sizee=2"],                    # no such key
    ["workload.micro_batch_size=two"],                   # not an int
    ["zero=stage9"],                                     # no such option
    ["zero=3"],                                          # a group given a number
    ["~workload.seq_len"],
    ["zero=stage1,stage2"],                              # a sweep: the whole way
]


@pytest.mark.parametrize("overrides", SPLIT_CASES + _suite_lines()[::3], ids=lambda o: " ".join(o)[:60])
def test_the_group_choices_kept_and_the_values_applied_compose_as_hydra_does(conf, overrides):
    """The split (group choices composed once, value overrides applied by Hydra's own step) against
    one whole composition: the same BenchConfig, or the same error message."""
    def outcome(split: bool):
        try:
            return composition._hydra(list(overrides), split=split)
        except ConfigError as exc:
            return f"ConfigError: {exc}"

    whole = outcome(False)
    assert outcome(True) == whole
    assert outcome(True) == whole          # and again, from the kept group choices
    composition._NODES.clear()
    assert outcome(True) == whole          # and from the disk cache
