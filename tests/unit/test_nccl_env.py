"""The NCCL environment registry: every known variable takes its documented values and refuses
others with a message naming the field, the variable, the value and what is valid."""
from __future__ import annotations

import pytest
import yaml
from unit_helpers import CONF_DIR

from harness.config.nccl_env import ENV_DOC, KNOWN, normalise_nccl_env, validate_nccl_env
from harness.errors import ConfigError

FIELD = "platform.nccl_env"

# (variable, values it accepts, a value it refuses, fragments of "what is valid" in the message)
CASES = [
    ("NCCL_ALGO", ["Ring", "Tree,Ring", "ring,nvlstree", "^NVLS,CollnetDirect", "PAT",
                   "Ring;AllReduce:Tree,Ring;Broadcast:^Tree", "allreduce:CollnetChain"],
     "Rign", ["Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT", "^"]),
    ("NCCL_PROTO", ["LL", "LL,LL128,Simple", "^LL128", "simple", "^LL128;AllReduce:LL128"],
     "LL256", ["LL", "LL128", "Simple", "^"]),
    ("NCCL_CROSS_NIC", ["0", "1", "2"], "3", ["0 to 2"]),
    ("NCCL_NTHREADS", ["64", "128", "256", "512"], "100", ["64, 128, 256, 512"]),
    ("NCCL_SOCKET_NTHREADS", ["1", "16"], "17", ["1 to 16"]),
    ("NCCL_NSOCKS_PERTHREAD", ["1", "64"], "0", ["1 to 64"]),
    ("NCCL_MIN_NCHANNELS", ["1", "32"], "0", [">= 1"]),
    ("NCCL_MAX_NCHANNELS", ["1", "64"], "-1", [">= 1"]),
    ("NCCL_SOCKET_IFNAME", ["eth", "=eth0", "=eth0,eth1", "^docker", "^=docker0,lo", "ib0"],
     "eth0, eth1", ["interface name prefixes", "^", "="]),
    ("NCCL_IB_DISABLE", ["0", "1"], "yes", ["0 or 1"]),
    ("NCCL_IB_HCA", ["mlx5", "=mlx5_0:1,mlx5_1:1", "^=mlx5_3"], "mlx5_0:x", [":<port>", "^", "="]),
    ("NCCL_CHECKS_DISABLE", ["0", "1"], "2", ["0 or 1"]),
    ("NCCL_CHECK_POINTERS", ["0", "1"], "on", ["0 or 1"]),
    ("NCCL_SET_STACK_SIZE", ["0", "1"], "-1", ["0 or 1"]),
    ("NCCL_BUFFSIZE", ["4194304", "1024", "0x400000"], "4MB", ["integer", ">= 1"]),
    ("NCCL_DEBUG", ["VERSION", "WARN", "INFO", "TRACE", "info"], "VERBOSE",
     ["VERSION", "WARN", "INFO", "TRACE"]),
    ("NCCL_DEBUG_SUBSYS", ["INIT", "INIT,COLL,NET", "^INIT,ENV", "ALL", "tuning"], "INIT,COLLS",
     ["INIT", "COLL", "TUNING", "^"]),
    ("NCCL_DEBUG_FILE", ["/tmp/nccl.%h.%p.log"], "", ["non-empty"]),
    ("NCCL_P2P_DISABLE", ["0", "1"], "2", ["0 or 1"]),
    ("NCCL_SHM_DISABLE", ["0", "1"], "disable", ["0 or 1"]),
    ("NCCL_NET_GDR_LEVEL", ["LOC", "PIX", "PXB", "PHB", "SYS", "sys", "2"], "FAR",
     ["LOC", "PIX", "PXB", "PHB", "SYS", "integer"]),
    ("NCCL_IB_GID_INDEX", ["0", "3", "-1"], "-2", [">= -1"]),
    ("NCCL_IB_TC", ["0", "106", "255"], "256", ["0 to 255"]),
    ("NCCL_IB_QPS_PER_CONNECTION", ["1", "4"], "0", [">= 1"]),
    ("NCCL_NVLS_ENABLE", ["0", "1", "2"], "3", ["0 to 2"]),
    ("NCCL_COLLNET_ENABLE", ["0", "1"], "2", ["0 or 1"]),
    ("NCCL_TOPO_FILE", ["/etc/nccl/topo.xml"], " ", ["non-empty"]),
    ("NCCL_LAUNCH_MODE", ["PARALLEL", "GROUP", "group"], "SERIAL", ["PARALLEL", "GROUP"]),
    ("NCCL_NET", ["IB", "Socket", "AWS Libfabric"], "", ["non-empty"]),
    ("NCCL_IGNORE_CPU_AFFINITY", ["0", "1"], "Y", ["0 or 1"]),
]


def test_every_registered_variable_has_a_case_and_every_case_is_registered():
    assert sorted(name for name, *_ in CASES) == sorted(KNOWN)


@pytest.mark.parametrize("name,good,bad,valid", CASES, ids=[c[0] for c in CASES])
def test_variable_accepts_its_documented_values(name, good, bad, valid):
    for value in good:
        validate_nccl_env({name: value}, FIELD)


@pytest.mark.parametrize("name,good,bad,valid", CASES, ids=[c[0] for c in CASES])
def test_variable_refuses_a_bad_value_naming_field_variable_value_and_what_is_valid(
        name, good, bad, valid):
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({name: bad}, FIELD)
    msg = str(err.value)
    assert f"{FIELD}.{name}={bad!r}" in msg
    for fragment in valid:
        assert fragment in msg, f"{fragment!r} missing from: {msg}"
    assert ENV_DOC in msg


@pytest.mark.parametrize("name,value,reason", [
    ("NCCL_ALGO", "Ring,", "unknown element ''"),
    ("NCCL_ALGO", "^", "unknown element ''"),
    ("NCCL_ALGO", "AllReduce:Tree;Ring", "lacks a '<collective>:' prefix"),
    ("NCCL_ALGO", "AllGathr:Ring", "unknown collective 'AllGathr'"),
    ("NCCL_PROTO", "AllReduce:Tree", "unknown element 'Tree'"),
    ("NCCL_DEBUG_SUBSYS", "AllReduce:INIT", "unknown element 'AllReduce:INIT'"),
    ("NCCL_SOCKET_IFNAME", "", "bad entry ''"),
    ("NCCL_SOCKET_IFNAME", "eth0,,eth1", "bad entry ''"),
    ("NCCL_NTHREADS", "abc", "not an integer"),
    ("NCCL_BUFFSIZE", "4.5e6", "not an integer"),
    ("NCCL_BUFFSIZE", "010", "not an integer"),
    ("NCCL_IB_TC", " 3", "not an integer"),
    ("NCCL_SOCKET_NTHREADS", "four", "not an integer"),
    ("NCCL_NET_GDR_LEVEL", "-1", "out of range"),
])
def test_malformed_values_say_what_is_wrong(name, value, reason):
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({name: value}, FIELD)
    assert reason in str(err.value)
    assert name in str(err.value)


@pytest.mark.parametrize("typo,meant", [
    ("NCCL_ALOG", "NCCL_ALGO"),
    ("NCCL_PROTOCOL", "NCCL_PROTO"),
    ("NCCL_CHECK_DISABLE", "NCCL_CHECKS_DISABLE"),
    ("NCCL_SOCKET_IFNAMES", "NCCL_SOCKET_IFNAME"),
    ("NCCL_IB_HCAS", "NCCL_IB_HCA"),
])
def test_unknown_name_is_an_error_suggesting_the_close_match(typo, meant):
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({"NCCL_DEBUG": "INFO", typo: "1"}, FIELD)
    msg = str(err.value)
    assert f"{FIELD}.{typo}='1'" in msg
    assert f"did you mean {meant}" in msg
    assert "harness/config/nccl_env.py" in msg


def test_unknown_name_without_a_close_match_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({"FOO": "1"}, FIELD)
    msg = str(err.value)
    assert "not a known NCCL environment variable" in msg
    assert "NCCL_ALGO" in msg and "NCCL_SOCKET_IFNAME" in msg
    assert "harness/config/nccl_env.py" in msg


def test_socket_threads_times_sockets_per_thread_may_not_exceed_64():
    validate_nccl_env({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "8"}, FIELD)
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({"NCCL_SOCKET_NTHREADS": "16", "NCCL_NSOCKS_PERTHREAD": "8"}, FIELD)
    msg = str(err.value)
    assert "NCCL_SOCKET_NTHREADS" in msg and "NCCL_NSOCKS_PERTHREAD" in msg
    assert "16 x 8" in msg and "64" in msg


def test_min_channels_may_not_exceed_max_channels():
    validate_nccl_env({"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4"}, FIELD)
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({"NCCL_MIN_NCHANNELS": "8", "NCCL_MAX_NCHANNELS": "4"}, FIELD)
    assert "NCCL_MIN_NCHANNELS='8'" in str(err.value)
    assert "NCCL_MAX_NCHANNELS=4" in str(err.value)


def test_normalise_turns_ints_and_bools_into_nccls_strings():
    env = {"NCCL_NTHREADS": 256, "NCCL_IB_DISABLE": True, "NCCL_P2P_DISABLE": False,
           "NCCL_SHM_DISABLE": "True", "NCCL_COLLNET_ENABLE": "false", "NCCL_NVLS_ENABLE": "true",
           "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "True"}
    assert normalise_nccl_env(env) == {
        "NCCL_NTHREADS": "256", "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "0",
        "NCCL_SHM_DISABLE": "1", "NCCL_COLLNET_ENABLE": "0", "NCCL_NVLS_ENABLE": "1",
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "True"}


def test_validate_accepts_what_hydra_gives_ints_and_bools_and_checks_them():
    validate_nccl_env({"NCCL_NTHREADS": 256, "NCCL_IB_DISABLE": True, "NCCL_BUFFSIZE": 1 << 22}, FIELD)
    with pytest.raises(ConfigError) as err:
        validate_nccl_env({"NCCL_NTHREADS": 100}, FIELD)
    assert f"{FIELD}.NCCL_NTHREADS='100'" in str(err.value)
    with pytest.raises(ConfigError, match="NCCL_NTHREADS='1'"):
        validate_nccl_env({"NCCL_NTHREADS": True}, FIELD)  # a bool is 1, not a thread count


@pytest.mark.parametrize("value", [4.5, None, ["Ring"]])
def test_values_that_are_not_strings_ints_or_bools_are_errors(value):
    with pytest.raises(ConfigError) as err:
        normalise_nccl_env({"NCCL_ALGO": value}, field=FIELD)
    assert f"{FIELD}.NCCL_ALGO={value!r}" in str(err.value)
    assert "Ring" in str(err.value)


@pytest.mark.parametrize("platform", sorted(p.stem for p in (CONF_DIR / "platform").glob("*.yaml")))
def test_every_shipped_platform_carries_a_valid_nccl_env(platform):
    data = yaml.safe_load((CONF_DIR / "platform" / f"{platform}.yaml").read_text())
    validate_nccl_env(data.get("nccl_env") or {}, f"platform {platform}: nccl_env")


def test_registry_entries_are_complete():
    for name, var in KNOWN.items():
        assert var.name == name and name.startswith("NCCL_")
        assert var.doc and var.valid()
        assert var.url().startswith(ENV_DOC + "#nccl-")
