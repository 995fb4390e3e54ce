"""Container tooling run from the repository root with the venv's python: `python -m
containers.recipes` (`make containers`) and `python -m containers.lock` (`make lock`)."""
