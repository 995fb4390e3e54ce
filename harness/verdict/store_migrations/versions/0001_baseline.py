"""The unversioned schema of suite commits up to 8aa740d: nights, runs, bench_runs.

Revision ID: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nights",
        sa.Column("night", sa.String(64), primary_key=True),
        sa.Column("platform", sa.String(64), primary_key=True),
        sa.Column("suite", sa.String(128), nullable=False),
        sa.Column("out_dir", sa.Text, nullable=False),
        sa.Column("started_utc", sa.String(32), nullable=False),
        sa.Column("finished_utc", sa.String(32)))
    op.create_table(
        "runs",
        sa.Column("night", sa.String(64), primary_key=True),
        sa.Column("platform", sa.String(64), primary_key=True),
        sa.Column("repeat", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.String(256), primary_key=True),
        sa.Column("benchmark", sa.String(128), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_utc", sa.String(32), nullable=False),
        sa.Column("record", sa.Text, nullable=False))
    op.create_table(
        "bench_runs",
        sa.Column("machine", sa.String(256), primary_key=True),
        sa.Column("platform", sa.String(64), primary_key=True),
        sa.Column("out_dir", sa.Text, primary_key=True),
        sa.Column("run_id", sa.String(256), primary_key=True),
        sa.Column("benchmark", sa.String(128), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_utc", sa.String(32), nullable=False),
        sa.Column("record", sa.Text, nullable=False))
