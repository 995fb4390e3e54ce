"""Hydra multirun for the harness's commands: `-m key=a,b other=x,y` runs every combination.

Sweep syntax is Hydra's own (comma lists, range(), choice(), glob()), parsed by Hydra's override
parser; the combinations are the cartesian product, in Hydra's BasicSweeper order.
"""
from __future__ import annotations

import itertools

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from .errors import HarnessError


def split_flag(args: list[str]) -> tuple[bool, list[str]]:
    """(multirun?, the other arguments) from `-m` / `--multirun` anywhere in args."""
    multirun = any(a in ("-m", "--multirun") for a in args)
    return multirun, [a for a in args if a not in ("-m", "--multirun")]


def expand(overrides: list[str], multirun: bool) -> list[list[str]]:
    """Every combination of the sweep overrides, each a plain override list. Without multirun,
    a sweep is an error: it would otherwise be taken as one odd value."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise HarnessError(f"cannot parse overrides {overrides}: {exc}") from None
    choices = []
    for o in parsed:
        key = o.input_line.split("=", 1)[0]
        if o.is_sweep_override():
            if not multirun:
                raise HarnessError(f"{o.input_line} is a sweep: add -m (--multirun) to run each value")
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(combo) for combo in itertools.product(*choices)] if choices else [[]]


def labels(jobs: list[list[str]]) -> list[str]:
    """A short name per combination: the keys whose values differ between jobs, with their values."""
    def parts(job: list[str]) -> list[tuple[str, str]]:
        return [tuple(o.split("=", 1)) for o in job if "=" in o]

    keys = [k for k, _ in parts(jobs[0])]
    varying = [k for k in keys if len({dict(parts(job)).get(k) for job in jobs}) > 1]
    return [",".join(f"{k.lstrip('+~').split('.')[-1]}={dict(parts(job))[k]}" for k in varying)
            for job in jobs]
