"""change skipped backends: the backends a change was not run on, and why (a backend the
policy runs on nightly dispatches only), shown on its commit page and in /api/changes

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("changes") as batch:
        batch.add_column(sa.Column("skipped", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("changes") as batch:
        batch.drop_column("skipped")
