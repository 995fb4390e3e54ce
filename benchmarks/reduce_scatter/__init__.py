"""A real reduce-scatter for ZeRO-1/2's gradient reduction: install.py applies it to an engine and
describes the paths; common.py, layout.py (pure, no torch: the performance model uses it), zero1.py
and zero2.py hold the pieces. Nothing is imported here, so layout.py stays torch-free."""
