"""python -m testbed up|down|status|shape|exec: an emulated Slurm cluster on this machine (as root).

    python -m testbed up --nodes 2 --link 1gbit     # make cluster-up NODES=2 LINK=1gbit
    python -m testbed up --clock-skew 1234          # node K's monotonic clock (K-1) x 1234 s ahead (CLOCK_SKEW=)
    python -m testbed exec -- sbatch --nodes=2 --wrap 'srun hostname'   # a command on node1
    python -m testbed exec --node 2 -- ip -br addr
    python -m testbed shape --link 250mbit          # re-shape every node link while it runs
    python -m testbed down                          # make cluster-down

The cluster stays up (detached) until `down`. `--name` (default "default") tells clusters apart.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .cluster import EmulatedCluster, reap_stale
from .network import MAX_CLOCK_SKEW_S, link_gbps
from .system import Unavailable


def _link(value: str) -> str:
    try:
        link_gbps(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _nodes(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"--nodes {value!r}: a whole number of nodes from 1 to 64")
    return n


def _skew(value: str) -> int:
    try:
        s = int(value)
    except ValueError:
        s = -1
    if not 0 <= s <= MAX_CLOCK_SKEW_S:
        raise argparse.ArgumentTypeError(f"--clock-skew {value!r}: whole seconds from 0 to {MAX_CLOCK_SKEW_S}")
    return s


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m testbed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("up", "start a cluster (detached)"), ("down", "stop it and remove everything it made"),
                       ("status", "nodes, link and daemons"), ("shape", "set every node link's rate"),
                       ("exec", "run a command on a node (SLURM_CONF set)")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--name", default="default", help="the cluster's name (default: default)")
        if name == "up":
            s.add_argument("--nodes", type=_nodes, default=2, help="number of nodes (default 2)")
            s.add_argument("--clock-skew", type=_skew, default=0, metavar="S",
                           help="node K's monotonic clock runs (K-1) x S seconds ahead of node1's, as on separate "
                                "machines (default 0: the one kernel's clock)")
        if name in ("up", "shape"):
            s.add_argument("--link", type=_link, default="1gbit" if name == "up" else None, required=name == "shape",
                           help="rate of each node link: a tc rate (1gbit, 250mbit) or none")
        if name == "exec":
            s.add_argument("--node", type=int, default=1, help="node number (default 1: the controller)")
            s.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return p


def describe(c: EmulatedCluster) -> str:
    rate = "unshaped" if c.link_gbps is None else f"{c.link} ({c.payload_gbps:.3f} Gbit/s TCP payload)"
    skew = f", node K's monotonic clock (K-1) x {c.clock_skew_s} s ahead" if c.clock_skew_s else ""
    return (f"emulated cluster {c.name!r}: {c.num_nodes} nodes ({', '.join(c.hostnames)}), links {rate}{skew}, "
            f"SLURM_CONF={c.conf}")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "up":
            cluster = EmulatedCluster(args.name, args.nodes, args.link, detached=True, clock_skew_s=args.clock_skew)
            cluster.start()
            print(f"{describe(cluster)}; up in {cluster.start_s:.1f} s")
            print(f"  run on it:  python -m testbed exec --name {args.name} -- sbatch ...   |   "
                  "make bench PLATFORM=cpu-cluster\n  stop it:    make cluster-down")
            return 0
        if args.command == "down":
            reap_stale()
            try:
                cluster = EmulatedCluster.load(args.name)
            except Unavailable as e:
                print(f"nothing to do: {e}")
                return 0
            cluster.stop()
            print(f"emulated cluster {args.name!r} stopped and removed")
            return 0
        cluster = EmulatedCluster.load(args.name)
        if args.command == "status":
            print(describe(cluster))
            print("  sinfo: " + ", ".join(f"{h} {s}" for h, s in sorted(cluster.node_states().items())))
            return 0
        if args.command == "shape":
            cluster.shape(args.link)
            print(describe(cluster))
            return 0
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            print("error: exec needs a command: python -m testbed exec [--node K] -- COMMAND [ARGS...]",
                  file=sys.stderr)
            return 2
        if not 1 <= args.node <= cluster.num_nodes:
            print(f"error: --node {args.node}: the cluster has nodes 1..{cluster.num_nodes}", file=sys.stderr)
            return 2
        return subprocess.run(cluster.command(command, args.node), env=cluster.env(dict(os.environ))).returncode
    except Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
