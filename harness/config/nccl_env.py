"""The NCCL environment variables a run may carry, with their value domains, and their validation.

NCCL reads its environment leniently: a misspelt name is never read, and most bad values fall
back to the default with at most an INFO line. A benchmark would then measure something other
than what its config says, so here an unknown name or a bad value is a ConfigError, raised
before anything launches. Domains come from NCCL's documentation (ENV_DOC) and, where the page
is silent, from NCCL's source (src/graph/tuning.cc, src/debug.cc, src/transport/net_socket.cc).

Add a variable: one `NcclVar(...)` line in `_VARS`; its kind says how its value is checked.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Optional

from ..errors import ConfigError

ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
NCCL_ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
NCCL_PROTOS = ("LL", "LL128", "Simple")
NCCL_COLLECTIVES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
"""Prefixes of the per-collective NCCL_ALGO/NCCL_PROTO syntax (NCCL's ncclFuncStr)."""
DEBUG_SUBSYSTEMS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL",
                    "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "ALL")
MAX_SOCKET_CONNECTIONS = 64
"""NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD may not exceed this (ENV_DOC)."""

_INT_RE = re.compile(r"-?(0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)")
_IFNAME_RE = re.compile(r"[^\s,]+")
_HCA_RE = re.compile(r"[^\s,:]+(:[0-9]+)?")


class Kind(str, Enum):
    integer = "integer"
    """An integer in [min_value, max_value], or one of `choices` when given."""
    boolean = "boolean"
    """0 or 1."""
    choice = "choice"
    """One of `choices` (case-insensitive, as NCCL compares them)."""
    level = "level"
    """A path-type name from `choices` or a legacy integer >= 0 (NCCL_NET_GDR_LEVEL)."""
    choice_list = "choice_list"
    """Comma list of `choices`, optionally prefixed with ^ (exclude); with `per_collective`, also
    `<list>;<collective>:<list>;...`."""
    interfaces = "interfaces"
    """Comma list of name prefixes, optionally led by ^ (exclude) then = (exact names); with
    `ports`, each name may end in :<port>."""
    text = "text"
    """Any non-empty string (a name or a path)."""


@dataclass(frozen=True)
class NcclVar:
    name: str
    kind: Kind
    doc: str
    """One line: what the variable does."""
    choices: tuple[str, ...] = ()
    min_value: Optional[int] = None
    max_value: Optional[int] = None
    per_collective: bool = False
    ports: bool = False
    source: str = ""
    """URL of the domain's documentation; the variable's anchor on ENV_DOC unless given."""
    note: str = ""
    """Where a part of the domain the documentation does not give comes from."""

    def url(self) -> str:
        return self.source or f"{ENV_DOC}#{self.name.lower().replace('_', '-')}"

    def valid(self) -> str:
        """The domain in words, for error messages."""
        if self.kind == Kind.boolean:
            return "0 or 1"
        if self.kind == Kind.integer:
            if self.choices:
                return "one of " + ", ".join(self.choices)
            lo, hi = self.min_value, self.max_value
            if lo is not None and hi is not None:
                return f"an integer from {lo} to {hi}"
            return "an integer" + (f" >= {lo}" if lo is not None else "") + (
                f" <= {hi}" if hi is not None else "")
        if self.kind == Kind.choice:
            return "one of " + ", ".join(self.choices)
        if self.kind == Kind.level:
            return "one of " + ", ".join(self.choices) + " (or a legacy integer >= 0)"
        if self.kind == Kind.choice_list:
            text = f"a comma list of {', '.join(self.choices)}, optionally led by ^ to exclude them"
            if self.per_collective:
                text += (f"; per collective: '<list>;<collective>:<list>;...' with collectives "
                         f"{', '.join(NCCL_COLLECTIVES)} (e.g. '{self.choices[0]};AllReduce:"
                         f"^{self.choices[0]}')")
            return text
        if self.kind == Kind.interfaces:
            what = "device names (each optionally :<port>)" if self.ports else "interface name prefixes"
            return f"a comma list of {what}, optionally led by ^ (exclude) and then = (exact names)"
        return "a non-empty string"

    def problem(self, value: str) -> Optional[str]:
        """Why `value` is not in the domain, or None when it is."""
        if self.kind == Kind.choice or (self.kind == Kind.level and not _INT_RE.fullmatch(value)):
            return None if value.upper() in (c.upper() for c in self.choices) else "not a known value"
        if self.kind in (Kind.integer, Kind.boolean, Kind.level):
            number = _parse_int(value)
            if number is None:
                return "not an integer"
            if self.kind == Kind.boolean:
                return None if number in (0, 1) else "out of range"
            if self.kind == Kind.level:
                return None if number >= 0 else "out of range"
            if self.choices:
                return None if str(number) in self.choices else "not an allowed value"
            low = self.min_value is not None and number < self.min_value
            high = self.max_value is not None and number > self.max_value
            return "out of range" if low or high else None
        if self.kind == Kind.choice_list:
            return self._list_problem(value)
        if self.kind == Kind.interfaces:
            body = value[1:] if value.startswith("^") else value
            body = body[1:] if body.startswith("=") else body
            bad = [n for n in body.split(",") if not (_HCA_RE if self.ports else _IFNAME_RE).fullmatch(n)]
            return f"bad entry {bad[0]!r}" if bad else None
        return None if value.strip() else "empty"

    def _list_problem(self, value: str) -> Optional[str]:
        known = {c.upper() for c in self.choices}
        collectives = {c.upper() for c in NCCL_COLLECTIVES}
        for i, entry in enumerate(value.split(";") if self.per_collective else [value]):
            prefix, sep, items = entry.rpartition(":") if self.per_collective else ("", "", entry)
            if sep and prefix.upper() not in collectives:
                return f"unknown collective {prefix!r}"
            if not sep and i > 0:
                return f"entry {entry!r} lacks a '<collective>:' prefix (only the first may)"
            for item in (items[1:] if items.startswith("^") else items).split(","):
                if item.upper() not in known:
                    return f"unknown element {item!r}"
        return None


def _parse_int(value: str) -> Optional[int]:
    """NCCL reads integers with strtoll(s, NULL, 0): decimal or 0x hex (a leading 0 would be
    octal, which nobody means: refused)."""
    if not _INT_RE.fullmatch(value):
        return None
    return int(value, 16) if "x" in value.lower() else int(value, 10)


def _bool(name: str, doc: str) -> NcclVar:
    return NcclVar(name, Kind.boolean, doc)


_VARS = (
    NcclVar("NCCL_ALGO", Kind.choice_list, "Algorithms NCCL may use.", NCCL_ALGOS, per_collective=True,
            note="per-collective syntax: NCCL src/graph/tuning.cc parseList"),
    NcclVar("NCCL_PROTO", Kind.choice_list, "Protocols NCCL may use.", NCCL_PROTOS, per_collective=True,
            note="per-collective syntax: NCCL src/graph/tuning.cc parseList"),
    NcclVar("NCCL_CROSS_NIC", Kind.integer, "Rings/trees may use different NICs on different nodes: "
            "0 never, 1 always, 2 when faster (default).", min_value=0, max_value=2),
    NcclVar("NCCL_NTHREADS", Kind.integer, "CUDA threads per block.", ("64", "128", "256", "512")),
    NcclVar("NCCL_SOCKET_NTHREADS", Kind.integer, "CPU helper threads per socket-transport connection.",
            min_value=1, max_value=16),
    NcclVar("NCCL_NSOCKS_PERTHREAD", Kind.integer, "Sockets opened by each socket helper thread.",
            min_value=1, max_value=MAX_SOCKET_CONNECTIONS),
    NcclVar("NCCL_MIN_NCHANNELS", Kind.integer, "Minimum number of channels (CUDA blocks).", min_value=1),
    NcclVar("NCCL_MAX_NCHANNELS", Kind.integer, "Maximum number of channels (CUDA blocks).", min_value=1),
    NcclVar("NCCL_SOCKET_IFNAME", Kind.interfaces, "IP interfaces NCCL may use."),
    _bool("NCCL_IB_DISABLE", "1 disables the InfiniBand/RoCE verbs transport (IP sockets instead)."),
    NcclVar("NCCL_IB_HCA", Kind.interfaces, "RDMA devices (and ports) NCCL may use.", ports=True),
    _bool("NCCL_CHECKS_DISABLE", "1 disables argument checks (deprecated since NCCL 2.2.12)."),
    _bool("NCCL_CHECK_POINTERS", "1 checks CUDA pointers on every collective call."),
    _bool("NCCL_SET_STACK_SIZE", "1 sets the CUDA stack size to the largest NCCL kernel's."),
    NcclVar("NCCL_BUFFSIZE", Kind.integer, "Buffer size per pair of ranks, bytes (default 4 MiB).",
            min_value=1),
    NcclVar("NCCL_DEBUG", Kind.choice, "Log level.", ("VERSION", "WARN", "INFO", "ABORT", "TRACE"),
            note="ABORT: NCCL src/debug.cc"),
    NcclVar("NCCL_DEBUG_SUBSYS", Kind.choice_list, "Subsystems the INFO log covers.", DEBUG_SUBSYSTEMS,
            note="the full list: NCCL src/debug.cc"),
    NcclVar("NCCL_DEBUG_FILE", Kind.text, "Log file name (%h host, %p pid)."),
    _bool("NCCL_P2P_DISABLE", "1 disables the peer-to-peer (NVLink/PCI) transport."),
    _bool("NCCL_SHM_DISABLE", "1 disables the shared-memory transport."),
    NcclVar("NCCL_NET_GDR_LEVEL", Kind.level, "Farthest GPU-NIC distance that uses GPUDirect RDMA.",
            ("LOC", "PIX", "PXB", "PHB", "SYS")),
    NcclVar("NCCL_IB_GID_INDEX", Kind.integer, "RoCE global ID index (-1: NCCL picks one).", min_value=-1),
    NcclVar("NCCL_IB_TC", Kind.integer, "InfiniBand traffic class.", min_value=0, max_value=255,
            note="range: the IB traffic-class field is 8 bits"),
    NcclVar("NCCL_IB_QPS_PER_CONNECTION", Kind.integer, "IB queue pairs per connection.", min_value=1),
    NcclVar("NCCL_NVLS_ENABLE", Kind.integer, "NVLink SHARP: 0 off, 1 on, 2 when supported (default).",
            min_value=0, max_value=2, note="2: NCCL src/transport/nvls.cc"),
    _bool("NCCL_COLLNET_ENABLE", "1 enables CollNet (in-network reductions, e.g. SHARP)."),
    NcclVar("NCCL_TOPO_FILE", Kind.text, "XML topology file loaded before detection."),
    NcclVar("NCCL_LAUNCH_MODE", Kind.choice, "Kernel launch mode.", ("PARALLEL", "GROUP")),
    NcclVar("NCCL_NET", Kind.text, "Network module to use (IB, Socket or a plugin's name)."),
    _bool("NCCL_IGNORE_CPU_AFFINITY", "1 ignores the job's CPU affinity for GPU affinity."),
)
KNOWN: dict[str, NcclVar] = {v.name: v for v in _VARS}
"""Every NCCL variable a run may set, by name."""


def _takes_bool(var: Optional[NcclVar]) -> bool:
    return var is not None and (var.kind == Kind.boolean or (
        var.kind == Kind.integer and not var.choices and var.min_value == 0 and (var.max_value or 0) <= 2))


def normalise_nccl_env(env: Mapping[str, Any], *, field: str = "nccl_env") -> dict[str, str]:
    """Values in NCCL's string form: ints as decimal strings, booleans as "1"/"0" (also the
    "True"/"False" strings OmegaConf makes of YAML booleans in a dict[str, str], for variables
    that take 0/1). Other non-string values (floats, null, lists) are a ConfigError."""
    out: dict[str, str] = {}
    for name, value in env.items():
        var = KNOWN.get(name)
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, int):
            value = str(value)
        elif isinstance(value, str) and _takes_bool(var) and value.lower() in ("true", "false"):
            value = "1" if value.lower() == "true" else "0"
        elif not isinstance(value, str):
            raise ConfigError(f"{field}.{name}={value!r} is invalid: not a string, int or bool; valid: "
                              f"{var.valid() if var else 'a string'}")
        out[str(name)] = value
    return out


def validate_nccl_env(env: Mapping[str, Any], field: str) -> None:
    """Raise ConfigError naming `field`, the variable, its value and what is valid, for the first
    unknown name or out-of-domain value; also checks the documented cross-variable limits."""
    values = normalise_nccl_env(env, field=field)
    for name, value in values.items():
        var = KNOWN.get(name)
        if var is None:
            close = difflib.get_close_matches(name, list(KNOWN), n=3, cutoff=0.8)
            hint = (f"did you mean {' or '.join(close)}?" if close
                    else f"known: {', '.join(sorted(KNOWN))}.")
            raise ConfigError(
                f"{field}.{name}={value!r} is invalid: {name} is not a known NCCL "
                f"environment variable; {hint} If NCCL documents it ({ENV_DOC}), add it to the "
                f"registry (KNOWN) in harness/config/nccl_env.py")
        problem = var.problem(value)
        if problem:
            raise ConfigError(f"{field}.{name}={value!r} is invalid: {problem}; valid: "
                              f"{var.valid()} (see {var.url()})")
    _check_limits(values, field)


def _check_limits(values: dict[str, str], field: str) -> None:
    threads, socks = values.get("NCCL_SOCKET_NTHREADS"), values.get("NCCL_NSOCKS_PERTHREAD")
    if threads is not None and socks is not None and \
            _parse_int(threads) * _parse_int(socks) > MAX_SOCKET_CONNECTIONS:
        raise ConfigError(
            f"{field}.NCCL_NSOCKS_PERTHREAD={socks!r} is invalid: NCCL_SOCKET_NTHREADS x "
            f"NCCL_NSOCKS_PERTHREAD = {threads} x {socks} exceeds {MAX_SOCKET_CONNECTIONS}; valid: a "
            f"product <= {MAX_SOCKET_CONNECTIONS} (see {KNOWN['NCCL_NSOCKS_PERTHREAD'].url()})")
    low, high = values.get("NCCL_MIN_NCHANNELS"), values.get("NCCL_MAX_NCHANNELS")
    if low is not None and high is not None and _parse_int(low) > _parse_int(high):
        raise ConfigError(f"{field}.NCCL_MIN_NCHANNELS={low!r} is invalid: it exceeds "
                          f"NCCL_MAX_NCHANNELS={high}; valid: NCCL_MIN_NCHANNELS <= NCCL_MAX_NCHANNELS")
