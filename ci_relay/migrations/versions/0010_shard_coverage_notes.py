"""shard coverage notes: what became of a shard's coverage recording (kept, or refused and
why), shown on the run page

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shards") as batch:
        batch.add_column(sa.Column("coverage_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("shards") as batch:
        batch.drop_column("coverage_note")
