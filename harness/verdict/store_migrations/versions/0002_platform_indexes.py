"""Indexes for months of nights: a platform's runs by night (the nightly's baselines and trends), a
platform's nights by night (the last night of every platform), a machine's bench runs.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_platform_night", "runs", ["platform", "night"])
    op.create_index("ix_nights_platform_night", "nights", ["platform", "night"])
    op.create_index("ix_bench_runs_machine_platform", "bench_runs", ["machine", "platform", "created_utc"])
