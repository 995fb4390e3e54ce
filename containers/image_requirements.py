"""Whether every package of an image's stack (containers/image_stack.py) has what it requires:
Requires-Dist with its markers and extras, and Requires-Python, for the image's Python.

Each package's requirements are its Requires-Dist as installed in this venv, whose versions must
be the lock's (the check says so where they are not: run `make venv`), and, where the image's lock
records them (requirements-gpu.lock's `# requires:` lines: the metadata of the very wheels pip
resolved for Linux x86-64, torch's CUDA build with its nvidia-*, cuda-* and triton requirements
among them), those too: the gpu image's CUDA packages are checked without being installed here.
They are evaluated for the image's Python on Linux x86_64, with the extras the suite uses
(SUITE_EXTRAS) and those other requirements ask for; a requirement the suite leaves out on purpose
is in NOT_INSTALLED with the reason. Each package's Requires-Python (this venv's) must accept the
image's Python. Not covered: what pip resolves at build time for an install WITH dependencies
(none of the shipped images does one): the build's `pip check` covers those.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Optional

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from containers.gpu_lock import parse_requires
from containers.image_stack import Stack
from containers.lock import parse_lock

SUITE_EXTRAS: dict[str, tuple[str, ...]] = {
    "transformers": ("torch",),  # benchmarks/training/model.py builds LlamaForCausalLM: the PyTorch models
}
"""Extras of lock packages the suite uses (the lock installs with --no-deps, so nothing asks for
them; their requirements must hold all the same)."""
NOT_INSTALLED: dict[tuple[str, str], str] = {
    ("transformers", "accelerate"): (
        "the suite trains with DeepSpeed directly; transformers needs accelerate only for its Trainer and "
        "for device_map/low-memory loading of pretrained checkpoints, which the suite does not use "
        "(benchmarks/node/smoke_image.py builds the model without it)"),
}
"""(package, requirement) the suite deliberately does not install, with the reason."""


@dataclass(frozen=True)
class Dist:
    """What the check reads of an installed distribution."""
    version: str
    requires: tuple[str, ...]
    requires_python: Optional[str]


def installed_dist(name: str) -> Optional[Dist]:
    """The distribution `name` in this interpreter's environment (the venv); None if absent."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    return Dist(dist.version, tuple(dist.requires or ()), dist.metadata.get("Requires-Python"))


def lock_dists(lock_text: str, installed: Callable[[str], Optional[Dist]] = installed_dist
               ) -> Callable[[str], Optional[Dist]]:
    """What the check reads of each package: for a pin whose requirements the lock records (`#
    requires:`), the lock's version and those requirements, with this venv's own (its extras,
    Requires-Python) where it holds the same release; otherwise this venv's (`installed`)."""
    versions = {canonicalize_name(e.name): e.version for e in parse_lock(lock_text)}
    recorded = parse_requires(lock_text)

    def dist(name: str) -> Optional[Dist]:
        key, have = canonicalize_name(name), installed(name)
        if key not in recorded or key not in versions:
            return have
        same = have if have is not None and Version(have.version).public == Version(versions[key]).public else None
        requires = tuple(dict.fromkeys([*recorded[key], *(same.requires if same else ())]))
        return Dist(versions[key], requires, same.requires_python if same else None)
    return dist


def marker_env(python: str, extra: str = "") -> dict[str, str]:
    """PEP 508 marker variables of CPython `python` on Linux x86_64."""
    parts = python.split(".")
    full = ".".join((parts + ["0"])[:3])
    return {"python_version": ".".join(parts[:2]), "python_full_version": full,
            "implementation_name": "cpython", "implementation_version": full,
            "platform_python_implementation": "CPython", "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
            "platform_version": "", "extra": extra}


def resolve(stack: Stack, dist: Callable[[str], Optional[Dist]] = installed_dist) -> Stack:
    """Check every package's requirements and Requires-Python against the image's set; problems
    and notes are appended to `stack`, which is returned."""
    python = marker_env(stack.python)["python_full_version"]
    todo = [(pkg, "") for pkg in stack.packages.values()]
    todo += [(stack.packages[canonicalize_name(n)], e) for n, extras in SUITE_EXTRAS.items()
             if canonicalize_name(n) in stack.packages for e in extras]
    seen: set[tuple[str, str]] = set()
    problems: list[str] = []
    notes: list[str] = []
    while todo:
        pkg, extra = todo.pop(0)
        key = canonicalize_name(pkg.name)
        if (key, extra) in seen:
            continue
        seen.add((key, extra))
        d = dist(pkg.name)
        who = f"{pkg.name} {pkg.version}"
        if d is None:
            problems.append(f"{who} is not installed in this venv: its requirements cannot be read (run `make venv`)")
            continue
        if Version(d.version).public != Version(pkg.version).public:
            if pkg.source.startswith("base image"):
                if not extra:
                    notes.append(f"{who} ({pkg.source}): its own requirements are not checked (this venv has "
                                 f"{pkg.name} {d.version})")
            elif not extra:
                problems.append(f"this venv has {pkg.name} {d.version} but the image gets {who} from {pkg.source}: "
                                "its requirements were not checked (the venv is not the lock's; run `make venv`)")
            continue
        if not extra and d.requires_python:
            try:
                ok = SpecifierSet(d.requires_python).contains(python, prereleases=True)
            except InvalidSpecifier:
                ok = True
            if not ok:
                problems.append(f"{who} requires Python {d.requires_python}; the image has Python {stack.python}")
        for line in d.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(marker_env(stack.python, extra)):
                continue
            if req.marker is not None and extra and req.marker.evaluate(marker_env(stack.python, "")):
                continue  # not specific to the extra: checked with the package itself
            shown = req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "") + str(req.specifier)
            on = f" (extra {extra})" if extra else ""
            dep_key = canonicalize_name(req.name)
            reason = NOT_INSTALLED.get((key, dep_key))
            if reason is not None:
                notes.append(f"{who} requires {shown}{on}: not installed on purpose: {reason}")
                continue
            dep = stack.packages.get(dep_key)
            if dep is None:
                problems.append(f"{who} requires {shown}{on}; the image does not have {req.name}")
                continue
            if not req.specifier.contains(dep.version, prereleases=True):
                problems.append(f"{who} requires {shown}{on}; the image has {dep.name} {dep.version}")
            todo += [(dep, e) for e in sorted(req.extras)]
    stack.problems += sorted(set(problems))
    stack.notes += sorted(set(notes))
    return stack
