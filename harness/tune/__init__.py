"""`python -m harness tune`: the communication-aware three-step tuning method (see tuner.py; the
command is command.py)."""
