"""`python -m harness tune`: the command line of the tuning method (harness/tune/tuner.py)."""
from __future__ import annotations

from pathlib import Path

from ..atomic import make_folder
from ..config.compose import compose
from ..errors import HarnessError
from .outcome import check_resume, default_out
from .report import write_outputs
from .tuner import Tuner


def cli(args: list[str]) -> int:
    if any(a in ("-m", "--multirun", "--dry-run") for a in args):
        raise HarnessError("tune runs its own search: -m/--multirun and --dry-run do not apply")
    first = compose(args)
    out = Path(first.out).resolve() if first.out else default_out(first)
    tuner = Tuner(args, out, first)
    make_folder(out)   # first: a file at out= is named as such, not met by the resume check
    check_resume(out, tuner.cfg, tuner.base)
    best = tuner.run()
    tuner.save()
    paths = write_outputs(tuner, best, install=tuner.tune.install_preset)
    print(f"\n{tuner.confirmation.headline()}\noverrides: {' '.join(best.overrides)}")
    for what, path in paths.items():
        print(f"{what}: {path}")
    return 0
