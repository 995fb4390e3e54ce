"""What a bench's regressions became when it ran them again (config key confirm_regressions; harness/verdict/
confirmation.py): over months, a team's store counts per machine, platform and metric how often one run's
regression did not repeat, and how far beyond the tolerance those first readings lay (python -m harness alarms;
harness/verdict/alarms.py): the data to set a platform's tolerance from. Stores before it: the tables start empty.

confirm_benches: each bench that judged its first runs with confirm_regressions >= 1, and how many first verdicts of
each metric it judged (`judged`, JSON: the denominator of a false-alarm rate).
confirmations: each regression its first runs read, and what its reruns read.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "confirm_benches",
        sa.Column("machine", sa.String(256), primary_key=True),
        sa.Column("platform", sa.String(64), primary_key=True),
        sa.Column("out_dir", sa.Text, primary_key=True),
        sa.Column("times", sa.Integer, nullable=False),
        sa.Column("judged", sa.Text, nullable=False),
        sa.Column("created_utc", sa.String(32), nullable=False))
    op.create_table(
        "confirmations",
        sa.Column("machine", sa.String(256), primary_key=True),
        sa.Column("platform", sa.String(64), primary_key=True),
        sa.Column("out_dir", sa.Text, primary_key=True),
        sa.Column("record_id", sa.String(256), primary_key=True),
        sa.Column("metric", sa.String(64), primary_key=True),
        sa.Column("against", sa.String(16), primary_key=True),
        sa.Column("benchmark", sa.String(128), nullable=False),
        sa.Column("unit", sa.String(32)),
        sa.Column("reference", sa.Float, nullable=False),
        sa.Column("tolerance_pct", sa.Float),
        sa.Column("first_value", sa.Float, nullable=False),
        sa.Column("first_worse_pct", sa.Float, nullable=False),
        sa.Column("reruns", sa.Text, nullable=False),
        sa.Column("failed", sa.Text, nullable=False),
        sa.Column("beyond", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("final_verdict", sa.String(32)),
        sa.Column("final_value", sa.Float),
        sa.Column("created_utc", sa.String(32), nullable=False))
