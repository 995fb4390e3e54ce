"""Composition: conf/ and Hydra overrides into a validated BenchConfig. The only module that touches
Hydra's composition (the schema module imports omegaconf's MISSING only)."""
from __future__ import annotations

import copy
import hashlib
import os
import re
from collections import OrderedDict
from typing import Optional

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
            key = (tuple(groups), _conf_key())
            if key not in _NODES:
                _NODES[key] = _hydra_node(groups)
                if len(_NODES) > _NODES_MAX:
                    _NODES.popitem(last=False)
            node = copy.deepcopy(_NODES[key])   # the kept composition is never handed out
            ConfigLoaderImpl._apply_overrides_to_config(values, node)
        obj = OmegaConf.to_object(node)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:   # ValueError: Hydra's for zero=3
        raise ConfigError(_hydra_message(exc, overrides)) from None
    assert isinstance(obj, BenchConfig)
    return obj


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
