"""result notes: what an outcome does not say by itself (a hardware-generic test that ran on
the CPU under a device backend)

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("test_results") as batch:
        batch.add_column(sa.Column("note", sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("test_results") as batch:
        batch.drop_column("note")
