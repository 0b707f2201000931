"""release upgrade jobs: the A..B test diff, and the two changes that run it

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upgrades",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("repository", sa.String(length=256), nullable=False),
        sa.Column("base_sha", sa.String(length=64), nullable=False),
        sa.Column("head_sha", sa.String(length=64), nullable=False),
        sa.Column("backends", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("base_change_id", sa.Integer(), sa.ForeignKey("changes.id"), nullable=True),
        sa.Column("head_change_id", sa.Integer(), sa.ForeignKey("changes.id"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_upgrades_state", "upgrades", ["state"])


def downgrade() -> None:
    op.drop_index("ix_upgrades_state", table_name="upgrades")
    op.drop_table("upgrades")
