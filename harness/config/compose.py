"""Composition: conf/ and Hydra overrides into a validated BenchConfig. The only module that touches
Hydra's composition (the schema module imports omegaconf's MISSING only)."""
from __future__ import annotations

import copy
import hashlib
import os
import pickle
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Optional

import hydra
import omegaconf

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..atomic import write_bytes_atomic
from ..errors import ConfigError
from .schema import (CONF_DIR, GROUPS, BenchConfig, CollectiveConfig, PlatformConfig, SuiteConfig, WorkloadConfig,
                     ZeroConfig)
from .validate import resolve, validate


_REGISTERED = False
_NODES: "OrderedDict[tuple, DictConfig]" = OrderedDict()
_NODES_MAX = 256
"""Hydra's compositions of the group choices alone (suite=, platform=, zero=...), by (those overrides,
what conf/ holds, the variables it reads): one costs 0.2-0.6 s (Hydra's own config, each file loaded,
merged with its schema). The value overrides (workload.micro_batch_size=4, ...) are applied to a copy
by Hydra's own step for them (ConfigLoaderImpl._apply_overrides_to_config, after the defaults list is
composed, in struct mode, as Hydra's compose does), 25 ms: the trials of a tune, the cells of a model
sweep and a suite's runs differ in values far more than in groups. conf/ is keyed by content, so a
preset that tune installs or a file edited meanwhile is composed afresh."""
_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")
DISK_CACHE = CONF_DIR.parent / ".cache" / "compose"
"""The same compositions kept on disk for the next process (pickled, one file per key, written atomically):
every `python -m harness` command composes its suite's runs, the references' shapes and the baseline's
again, ~0.3 s each on one core before the first rank starts or after the last one ends; read back, 1
ms. The key adds to the in-memory one what makes a pickled composition valid: the source of
harness/config/ (the schema it was merged with), Hydra's, OmegaConf's and Python's versions. A file that
cannot be read or written is composed afresh, never an error: a read-only checkout composes as before."""
DISK_CACHE_MAX = 512
"""Files kept (each ~16 KB); past it the least recently used go. An edit of conf/ or of the schema leaves
its predecessors' files unused until then."""
_CODE_KEY: Optional[str] = None


def register_configs() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="platform", name="platform_schema", node=PlatformConfig)
    cs.store(group="workload", name="workload_schema", node=WorkloadConfig)
    cs.store(group="zero", name="zero_schema", node=ZeroConfig)
    cs.store(group="collective", name="collective_schema", node=CollectiveConfig)
    cs.store(group="suite", name="suite_schema", node=SuiteConfig)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _conf_key() -> tuple:
    """What a composition reads besides its overrides: every file under conf/ (by content: ~1 ms for
    the 80 KB) and the environment variables those files interpolate (${oc.env:NAME})."""
    digest = hashlib.sha1()
    names: set[str] = set()
    for path in sorted(CONF_DIR.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            digest.update(str(path.relative_to(CONF_DIR)).encode() + b"\0" + data + b"\0")
            names.update(_ENV_REF.findall(data.decode("utf-8", "replace")))
    return digest.hexdigest(), tuple((name, os.environ.get(name)) for name in sorted(names))


def compose(overrides: list[str]) -> BenchConfig:
    """Compose conf/ with Hydra overrides and return a validated BenchConfig (a new object each call)."""
    cfg = resolve(_hydra(list(overrides)))
    validate(cfg)
    return cfg


def _hydra(overrides: list[str], split: bool = True) -> BenchConfig:
    """Hydra's composition of `overrides` as an object; split=False: one whole composition, never the
    group choices' kept one (what the unit test holds the split against)."""
    try:
        parts = _split(overrides) if split else None
        if parts is None:
            node = _hydra_node(overrides)
        else:
            groups, values = parts
            node = copy.deepcopy(_kept_node(groups))   # the kept composition is never handed out
            ConfigLoaderImpl._apply_overrides_to_config(values, node)
        obj = OmegaConf.to_object(node)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:   # ValueError: Hydra's for zero=3
        raise ConfigError(_hydra_message(exc, overrides)) from None
    assert isinstance(obj, BenchConfig)
    return obj


def _kept_node(groups: list[str]) -> DictConfig:
    """Hydra's composition of the group choices: kept in this process, else on disk, else composed."""
    key = (tuple(groups), _conf_key())
    if key in _NODES:
        _NODES.move_to_end(key)
        return _NODES[key]
    path, disk = _disk_entry(key)
    node = _read_kept(path, disk)
    if node is None:
        node = _hydra_node(groups)          # raises on a bad choice: nothing kept
        _write_kept(path, disk, node)
    _NODES[key] = node
    if len(_NODES) > _NODES_MAX:
        _NODES.popitem(last=False)
    return node


def _disk_entry(key: tuple) -> tuple[Path, tuple]:
    """(the file, the key it holds) of a composition on disk."""
    disk = (key, _code_key())
    return DISK_CACHE / (hashlib.sha256(repr(disk).encode()).hexdigest()[:32] + ".pickle"), disk


def _code_key() -> str:
    """What a pickled composition depends on besides conf/ and its overrides: harness/config/'s source
    (the schema's dataclasses and enums it was merged with), Hydra's, OmegaConf's and Python's versions."""
    global _CODE_KEY
    if _CODE_KEY is None:
        digest = hashlib.sha1(f"{hydra.__version__} {omegaconf.__version__} {sys.version}".encode())
        for path in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        _CODE_KEY = digest.hexdigest()
    return _CODE_KEY


def _read_kept(path: Path, key: tuple) -> Optional[DictConfig]:
    try:
        with open(path, "rb") as f:
            kept_key, node = pickle.load(f)
    except Exception:  # noqa: BLE001 - missing, truncated, another version's: composed afresh
        return None
    try:
        os.utime(path)                      # recently used: pruned last
    except OSError:
        pass                                # a read-only cache is still read
    return node if kept_key == key and isinstance(node, DictConfig) else None


def _write_kept(path: Path, key: tuple, node: DictConfig) -> None:
    try:
        write_bytes_atomic(path, pickle.dumps((key, node), protocol=pickle.HIGHEST_PROTOCOL))
        kept = sorted(path.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime)
        for old in kept[:max(0, len(kept) - DISK_CACHE_MAX)]:
            old.unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - not writable, or not picklable: kept in this process only
        pass


def _hydra_node(overrides: list[str]) -> DictConfig:
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def _split(overrides: list[str]) -> Optional[tuple[list[str], list[Override]]]:
    """(the group choices, the value overrides parsed) as Hydra's defaults list tells them apart (a
    value: a key that names no config group, or a dict); None where anything is other than plain (a
    sweep, a package, Hydra's own settings, a line Hydra cannot parse): that goes the whole way."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException:
        return None
    groups, values = [], []
    for line, override in zip(overrides, parsed):
        key = override.key_or_group
        if override.is_sweep_override() or override.package is not None or key.startswith("hydra"):
            return None
        if isinstance(override.value(), dict) or not (CONF_DIR / key).is_dir():
            values.append(override)
        else:
            groups.append(line)
    return groups, values


def _hydra_message(exc: Exception, overrides: list[str]) -> str:
    msg = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in msg:
        msg += "\n  " + str(cause).strip().splitlines()[0]
    msg = msg.split("\nConfig search path:")[0]
    for group in GROUPS:
        if f"'{group}'" in msg or f"{group}/" in msg:
            msg += f"\n  valid {group} options: {', '.join(group_options(group))}"
            break
    return f"invalid configuration ({' '.join(overrides) or 'no overrides'}):\n  {msg}"
