"""Where a first reading's confirmation came from: a bench that ran its regressions again (confirm_regressions), or a
nightly whose first repeat was judged alone and then against all its repeats (harness/nightly.py first_repeat), so
that `python -m harness alarms` counts both and says how many of each. Kept before it: every one a bench's.

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("confirm_benches", sa.Column("source", sa.String(16), nullable=False, server_default="bench"))
