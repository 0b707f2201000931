"""failure details: each result's full failure text; other relays' results by commit

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
    with op.batch_alter_table("test_results") as batch:
        batch.add_column(sa.Column("details", sa.Text(), nullable=True))
    op.create_index(
        "ix_crcr_results_head", "crcr_results", ["upstream_repo", "head_sha"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_crcr_results_head", table_name="crcr_results")
    with op.batch_alter_table("test_results") as batch:
        batch.drop_column("details")
