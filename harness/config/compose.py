"""Composition: conf/ and Hydra overrides into a validated BenchConfig. The only module that touches
Hydra's composition (the schema module imports omegaconf's MISSING only)."""
from __future__ import annotations

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import ConfigError
from .schema import (CONF_DIR, GROUPS, BenchConfig, CollectiveConfig, PlatformConfig, SuiteConfig, WorkloadConfig,
                     ZeroConfig)
from .validate import resolve, validate


def register_configs() -> None:

    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="platform", name="platform_schema", node=PlatformConfig)
    cs.store(group="workload", name="workload_schema", node=WorkloadConfig)
    cs.store(group="zero", name="zero_schema", node=ZeroConfig)
    cs.store(group="collective", name="collective_schema", node=CollectiveConfig)
    cs.store(group="suite", name="suite_schema", node=SuiteConfig)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: list[str]) -> BenchConfig:
    """Compose conf/ with Hydra overrides and return a validated BenchConfig."""

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = hydra_compose(config_name="config", overrides=list(overrides))
        obj = OmegaConf.to_object(node)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_hydra_message(exc, overrides)) from None
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(obj, BenchConfig)
    cfg = resolve(obj)
    validate(cfg)
    return cfg


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
