"""DeepSpeed's compiled ops: built once at install time, loaded at run time without a lock file.

Why. DeepSpeed is installed with DS_BUILD_OPS=0, so on first use it JIT-builds an op through
torch.utils.cpp_extension.load, which holds a lock FILE (<TORCH_EXTENSIONS_DIR>/<op>/lock) while it
builds the op or only checks, with ninja, that the op is already built. A process killed inside
leaves the file behind, and every later load of that op sleeps in torch's FileBaton.wait, which has
no timeout: one killed rank made every later run on that checkout time out.

So nothing at run time builds an op or waits on a lock:
- `python -m benchmarks.node.ops build` (`make venv`, the container images) builds the ops into
  <sys.prefix>/deepspeed-ops/<accelerator>/ (SUITE_DEEPSPEED_OPS_DIR replaces <sys.prefix>/deepspeed-ops):
  one folder per installation, since an op is valid only for the torch and deepspeed it was
  compiled against. Builds are serialised by flock(2), which the kernel drops when its holder dies
  (it cannot go stale); each library is copied into place atomically, then its manifest
  (<op>.json: the versions it was built for) is written; a build killed half-way leaves no manifest.
- `preload()`, in every rank before deepspeed.init_distributed, imports each built library directly
  (importlib, as torch's own loader does once it has the file: no ninja, no compiler, no lock) and
  hands it to DeepSpeed through OpBuilder._loaded_ops, the cache OpBuilder.load() reads first.
  From then on any other JIT build in that process is an error naming the build command.
- An op that is not built (or was built for other versions): deepspeed_shm_comm is optional:
  DeepSpeed goes on without it, as it does on hosts where it is unsupported (the suite's runs never
  use it: it serves only inference_all_reduce, and only when LOCAL_SIZE is set); the others fail
  fast, before the first step, with the command that builds them (the harness refuses such a run
  before launch when it can see the installation: harness/launch/preflight.py).

The suite's run paths load (DeepSpeed 0.19.8; found by reading deepspeed/comm/torch.py and
runtime/engine.py `_configure_basic_optimizer`): `OPS` below. On the cuda accelerator DeepSpeed has
no shm_comm op and the default optimizer is torch's AdamW, so a default GPU run loads no op.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

OPS_DIR_VAR = "SUITE_DEEPSPEED_OPS_DIR"
"""Replaces <sys.prefix>/deepspeed-ops (a writable place when the installation is read-only)."""
PAUSE_VAR = "SUITE_OPS_LOAD_PAUSE_S"
"""Tests only: seconds a rank sleeps inside the load of each op (to kill it there)."""
BUILD_LOCK = ".build.lock"
LIB_SUFFIX = ".so"  # torch.utils.cpp_extension.LIB_EXT off Windows


@dataclass(frozen=True)
class Op:
    name: str
    """DeepSpeed's op name (the builder's NAME): the library's module name and file name."""
    builder: str
    """The builder's class name, resolved per accelerator by DeepSpeed."""
    accelerators: tuple[str, ...]
    """Accelerators on which the suite's runs can load it."""
    loaded_by: str
    """The run path that loads it (for messages)."""
    default: bool
    """Built by `make venv` and the images (`build` without names)."""
    optional: bool
    """DeepSpeed runs without it when it is not built."""


OPS = (
    Op("deepspeed_shm_comm", "ShareMemCommBuilder", ("cpu",),
       "deepspeed.comm's TorchBackend, at init_distributed (every run on the cpu accelerator)",
       default=True, optional=True),
    Op("fused_adam", "FusedAdamBuilder", ("cpu", "cuda"),
       "workload.optimizer=deepspeed: DeepSpeed's FusedAdam", default=False, optional=False),
    Op("cpu_adam", "CPUAdamBuilder", ("cpu", "cuda"),
       "workload.optimizer=deepspeed with zero_optimization.offload_optimizer: DeepSpeedCPUAdam",
       default=False, optional=False),
    Op("dc", "DeepCompileBuilder", ("cuda",),
       "workload.compile=deepcompile: DeepCompile's native op (deepspeed.compile.util.get_deepcompile_handle)",
       default=False, optional=False),
)
BY_NAME = {op.name: op for op in OPS}


def needed_ops(accelerator: str, ds: Optional[dict[str, Any]]) -> list[Op]:
    """The ops a training run with DeepSpeed JSON `ds` loads on `accelerator` (None: a run that
    starts no DeepSpeed engine, e.g. a collective sweep). Mirrors DeepSpeedEngine's choice of
    optimizer: "adam"/"adamw" without torch_adam is DeepSpeedCPUAdam under optimizer offload to
    cpu/nvme, else FusedAdam. Pure: the harness calls it before launch."""
    if ds is None:
        return []
    ops = [op for op in OPS if op.name == "deepspeed_shm_comm" and accelerator in op.accelerators]
    optimizer = ds.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() in ("adam", "adamw") and \
            not (optimizer.get("params") or {}).get("torch_adam", False):
        offload = ((ds.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device")
        ops.append(BY_NAME["cpu_adam" if offload in ("cpu", "nvme") else "fused_adam"])
    if (ds.get("compile") or {}).get("deepcompile") and accelerator == "cuda":
        ops.append(BY_NAME["dc"])
    return ops


def ops_dir(accelerator: str) -> Path:
    """Where this installation's built ops for `accelerator` live."""
    root = os.environ.get(OPS_DIR_VAR) or str(Path(sys.prefix) / "deepspeed-ops")
    return Path(root) / accelerator


def build_command(names: Sequence[str], accelerator: str) -> str:
    """The command that builds `names` for this installation (what messages tell the user)."""
    return " ".join([sys.executable, "-m", "benchmarks.node.ops", "build", *names]
                    + ([] if accelerator == "cpu" else ["--accelerator", accelerator]))


def installed_versions() -> dict[str, str]:
    """What a built op must match: the interpreter's ABI, the machine, torch and deepspeed
    (read from the installed distributions, without importing them)."""
    return {"python": sys.implementation.cache_tag, "machine": platform.machine(),
            "torch": metadata.version("torch"), "deepspeed": metadata.version("deepspeed")}


@dataclass
class OpState:
    op: Op
    library: Path
    problem: Optional[str]
    """None: built for this installation; else why it cannot be used."""
    unsupported: bool = False
    """DeepSpeed has no such op for this accelerator on this host (nothing to build)."""


def state(op: Op, accelerator: str) -> OpState:
    folder = ops_dir(accelerator)
    library, manifest = folder / f"{op.name}{LIB_SUFFIX}", folder / f"{op.name}.json"
    if not library.exists() or not manifest.exists():
        return OpState(op, library, f"not built ({library} missing)" if not library.exists()
                       else f"not built ({manifest} missing: the build did not finish)")
    built = json.loads(manifest.read_text(encoding="utf-8")).get("versions", {})
    wrong = [f"{k} {built.get(k)} (installed: {v})" for k, v in installed_versions().items() if built.get(k) != v]
    return OpState(op, library, f"built for {', '.join(wrong)}" if wrong else None)


# --- run time (a rank) ----------------------------------------------------------------------------

def _builder_base(builder) -> type:
    """The class whose `_loaded_ops` OpBuilder.load() consults (deepspeed.ops.op_builder's OpBuilder,
    or a local install's op_builder one)."""
    return next(c for c in type(builder).__mro__ if "_loaded_ops" in c.__dict__)


def _import_library(name: str, library: Path):
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import DeepSpeed op {name} from {library}")
    module = importlib.util.module_from_spec(spec)
    pause_s = float(os.environ.get(PAUSE_VAR, "0") or 0)
    if pause_s:
        time.sleep(pause_s)
    spec.loader.exec_module(module)
    return module


def preload() -> list[OpState]:
    """Hand DeepSpeed every op built for this installation, loaded without any lock, and make any
    other JIT build in this process an error. Call before deepspeed.init_distributed. Returns the
    state of each op of this accelerator (each is also printed: it lands in the rank's log)."""
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    states, base = [], None
    for op in OPS:
        if accel._name not in op.accelerators:
            continue
        builder = accel.create_op_builder(op.builder)
        if builder is None:  # DeepSpeed has no such op here
            continue
        base = _builder_base(builder)
        st = state(op, accel._name)
        states.append(st)
        if st.problem is None:
            print(f"deepspeed op {op.name}: loading {st.library}", flush=True)
            start = time.perf_counter()
            base._loaded_ops[builder.name] = _import_library(builder.name, st.library)
            print(f"deepspeed op {op.name}: loaded in {(time.perf_counter() - start) * 1e3:.0f} ms "
                  "(prebuilt, no lock)", flush=True)
        elif op.optional:
            base._loaded_ops[builder.name] = None  # DeepSpeed's own "unsupported here" path
            print(f"warning: deepspeed op {op.name} {st.problem}; DeepSpeed runs without it "
                  f"(loaded by {op.loaded_by}; the suite's runs never call it). Build it once: "
                  f"{build_command([op.name], accel._name)}", flush=True)
    if base is not None:
        _forbid_jit(base, accel._name)
    return states


def _forbid_jit(base: type, accelerator: str) -> None:
    def refuse(self, verbose=True):
        known = self.name in BY_NAME
        raise RuntimeError(
            f"DeepSpeed op {self.name}: "
            f"{state(BY_NAME[self.name], accelerator).problem if known else 'not one of OPS in benchmarks/node/ops.py'}; "
            "the suite never JIT-builds ops at run time (a run killed during a build leaves a lock "
            f"that every later run waits on). Build it once: "
            + (build_command([self.name], accelerator) if known else
               f"add it to OPS in benchmarks/node/ops.py, then {build_command([self.name], accelerator)}"))
    base.jit_load = refuse


# --- install time (make venv, the images) ---------------------------------------------------------

@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Exclusive flock(2) on folder/.build.lock: waits only for a live build (the kernel releases
    it when its holder exits or is killed), then names this process in the file."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / BUILD_LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            print(f"waiting for another build of {folder} ({f.read().strip() or 'pid unknown'})", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        f.truncate(0)
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        yield


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def build(names: Sequence[str], accelerator: str) -> list[OpState]:
    """Build `names` for `accelerator` into ops_dir(accelerator); skip those already built for this
    installation. Returns their states afterwards."""
    os.environ["DS_ACCELERATOR"] = accelerator  # before deepspeed is imported
    # DeepSpeed builds with the first `ninja` on PATH: the interpreter's own (pip's ninja)
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    folder = ops_dir(accelerator)
    work = folder / "build"
    unsupported = set()
    with build_lock(folder):
        todo = [BY_NAME[n] for n in names if state(BY_NAME[n], accelerator).problem is not None]
        for n in names:
            if BY_NAME[n] not in todo:
                print(f"deepspeed op {n}: up to date in {folder}", flush=True)
        if todo:
            from deepspeed.accelerator import get_accelerator

            if accelerator == "cuda":
                arch_list_for_deepspeed(os.environ)

            os.environ["TORCH_EXTENSIONS_DIR"] = str(work)  # torch's JIT layout, kept for incremental rebuilds
            unsupported = {op.name for op in todo if not _build_one(op, get_accelerator(), folder, work)}
    states = [state(BY_NAME[n], accelerator) for n in names]
    for st in states:
        st.unsupported = st.op.name in unsupported
    return states


def arch_list_for_deepspeed(env: dict) -> Optional[str]:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19.8's JIT builder can read it: it sorts the entries by
    int() of each dotted part, so an arch-specific entry ('9.0a', '10.0a', which PyTorch's CUDA images
    set) stops every CUDA op build with "invalid literal for int() with base 10: '0a'" (seen on an H100
    node: DeepCompile's op could not be built). The suffix is dropped (9.0a -> 9.0: the same SM's
    portable code; +PTX kept), and the change printed. Returns the new value, or None when unchanged."""
    old = env.get("TORCH_CUDA_ARCH_LIST", "")
    parts = [p for p in old.replace(" ", ";").split(";") if p.strip()]
    new = []
    for p in parts:
        base, ptx = (p.split("+", 1) + [""])[:2]
        base = ".".join(x.rstrip("abcdefghijklmnopqrstuvwxyz") for x in base.split("."))
        entry = base + ("+" + ptx if ptx else "")
        if entry not in new:
            new.append(entry)
    value = ";".join(new)
    if not parts or value == ";".join(parts):
        return None
    env["TORCH_CUDA_ARCH_LIST"] = value
    print(f"TORCH_CUDA_ARCH_LIST {old!r} -> {value!r} for DeepSpeed's JIT builder (it cannot parse arch "
          "suffixes such as 9.0a)", flush=True)
    return value


DROPPED_CXX_ARGS = ("-g",)
"""DeepSpeed compiles its C++ with -g: debug information for a debugger, and the same machine code
without it (GCC's code generation does not depend on -g), at 28-35 % of the build's time (measured:
cpu_adam.cpp alone on one core 65 s with it, 47 s without; fused_adam on 2 cores 71 s, 46 s). The suite's builds leave it out; each op's
manifest names what was left out."""


def _without_debug_info(builder) -> list[str]:
    """Drop DROPPED_CXX_ARGS from the C++ flags this builder's jit_load() will pass; returns those it had."""
    flags = builder.cxx_args()
    builder.cxx_args = lambda: [a for a in flags if a not in DROPPED_CXX_ARGS]
    return [a for a in flags if a in DROPPED_CXX_ARGS]


def _build_one(op: Op, accel, folder: Path, work: Path) -> bool:
    """Build one op; False when DeepSpeed has no such op here (nothing built)."""
    builder = accel.create_op_builder(op.builder)
    if builder is None or not builder.is_compatible(verbose=False):
        print(f"deepspeed op {op.name}: DeepSpeed has none for the {accel._name} accelerator on this "
              "host; skipped", flush=True)
        return False
    dropped = _without_debug_info(builder)
    manifest = folder / f"{op.name}.json"
    manifest.unlink(missing_ok=True)  # until the new library is in place, the op is not built
    # we hold the build lock: torch's lock file in this op's folder is a killed build's leftover
    stale = work / builder.name / "lock"
    if stale.exists():
        stale.unlink(missing_ok=True)
        print(f"deepspeed op {op.name}: removed {stale}, left by a build that was killed (no build holds "
              f"{folder / BUILD_LOCK} but this one; torch's JIT loader would wait on it forever)", flush=True)
    print(f"deepspeed op {op.name}: building into {folder} (once; about a minute on 2 cores)", flush=True)
    start = time.perf_counter()
    module = builder.jit_load(verbose=False)
    build_s = time.perf_counter() - start
    library = folder / f"{op.name}{LIB_SUFFIX}"
    tmp = folder / f".{op.name}{LIB_SUFFIX}.tmp"
    shutil.copy2(module.__file__, tmp)
    os.replace(tmp, library)  # a rank that has the old file mapped keeps it
    _write_atomic(manifest, json.dumps({"op": op.name, "builder": op.builder, "accelerator": accel._name,
                                        "versions": installed_versions(), "build_s": round(build_s, 1),
                                        "cxx_args_dropped": dropped,
                                        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")
    print(f"deepspeed op {op.name}: built in {build_s:.0f} s -> {library}", flush=True)
    return True


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node.ops", description=(
        "Build DeepSpeed's ops once for this installation (make venv and the images call `build`), "
        "or show their state. Runs load them without any lock and never build one."))
    parser.add_argument("command", choices=["build", "status"])
    parser.add_argument("ops", nargs="*", metavar="OP",
                        help=f"ops ({', '.join(BY_NAME)}); default: {', '.join(o.name for o in OPS if o.default)} "
                             "(what the suite's default runs load)")
    parser.add_argument("--all", action="store_true", help="every op of the accelerator")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"],
                        help="DeepSpeed accelerator to build for (cuda: on a node with a GPU and nvcc)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.ops if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown op(s) {unknown}; valid: {sorted(BY_NAME)}")
    ours = [op.name for op in OPS if args.accelerator in op.accelerators]
    names = ours if args.all else (args.ops or [op.name for op in OPS if op.default and op.name in ours])
    if args.command == "build":
        states = build(names, args.accelerator)
    else:
        states = [state(BY_NAME[n], args.accelerator) for n in names]
    for st in states:  # build has said what it did; here only what is still wrong
        if args.command == "status" or (st.problem and not st.unsupported):
            print(f"{st.op.name}: " + ("built, " + str(st.library) if st.problem is None else
                                       "unsupported on this host" if st.unsupported else st.problem))
    # an op DeepSpeed itself has not here is no failure (runs go on as DeepSpeed does without it)
    return 1 if args.command == "build" and any(st.problem and not st.unsupported for st in states) else 0


if __name__ == "__main__":
    sys.exit(main())
