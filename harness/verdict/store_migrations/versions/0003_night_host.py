"""The host that started a night: a shared store (one PostgreSQL for a team) takes the nightlies of several
machines, and two of them running one platform's night under one id would resume each other's (the second
skipping every run the first stored) and be judged as one machine's. Nights stored before it: NULL (any host
may resume them, as before).

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("nights", sa.Column("host", sa.String(255), nullable=True))
