"""The harness's own cost as pytest-benchmark benchmarks (`make perf`, docs/tests.md).

The files are named perf_*.py so that `make test` (`pytest tests`, which collects test_*.py) never
runs them; `python -m tests.benchmarks` runs them, saves each run under .benchmarks/<machine class>/
and compares it with the last saved run of the same machine class."""
