"""The controller side of the suite: configure, plan, launch, record, report.

Never imports torch at import time: `--help`, planning and reporting stay fast and GPU-free.
"""
