"""Shared fixtures of the unit tests: composed configs (Hydra composition costs ~1 s, so each
distinct override list is composed once per session and handed out as a deep copy)."""
from __future__ import annotations

import copy
from functools import lru_cache

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)


@lru_cache(maxsize=None)
def _compose_once(overrides: tuple[str, ...]):
    from harness.config.compose import compose

    return compose(list(overrides))


@pytest.fixture(scope="session")
def composed():
    """composed(["zero=stage2", ...]) -> a fresh (deep-copied) validated BenchConfig."""
    def get(overrides=()):
        return copy.deepcopy(_compose_once(tuple(overrides)))
    return get


@pytest.fixture
def tiny_cfg(composed):
    """The default cpu platform with llama-tiny: 2 ranks, mb 2 x ga 4, seq 128, fp32."""
    return composed(["platform=cpu", "workload=llama-tiny"])
