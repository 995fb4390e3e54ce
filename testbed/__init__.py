"""Test beds made of real parts, for the tests and for a person at a terminal.

- `testbed.network`: N nodes on one machine: a network namespace per node with its own hostname
  and hosts file, a routed switch namespace, rate-shaped links (tc tbf). The root namespace's
  interfaces are never touched.
- `testbed.cluster`: that network plus a real Slurm (munged, slurmctld on node1, one slurmd per
  node): `python -m testbed up --nodes 2 --link 1gbit` / `down` / `exec` / `shape`, and the
  `emulated_cluster` pytest fixture (tests/integration/conftest.py).
- `testbed.system`: binaries, Debian packages and processes of the host.

Torch-free and independent of `harness/`; the harness never imports it.
"""
