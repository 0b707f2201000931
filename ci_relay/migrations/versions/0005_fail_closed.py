"""fail closed: counted audit rows (one per kind of rejection and window);
where a shard ran, why a shard or a run failed

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
    with op.batch_alter_table("audit_records") as batch:
        batch.add_column(sa.Column("count", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("last_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
    with op.batch_alter_table("shards") as batch:
        batch.add_column(sa.Column("runtime", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("error")
    with op.batch_alter_table("shards") as batch:
        batch.drop_column("error")
        batch.drop_column("runtime")
    with op.batch_alter_table("audit_records") as batch:
        batch.drop_column("last_at")
        batch.drop_column("count")
