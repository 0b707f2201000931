"""coverage maps: per shard, the functions each test executed (the selector's evidence)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "coverage_maps",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "shard_id", sa.Integer(), sa.ForeignKey("shards.id"), nullable=False, unique=True
        ),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id"), nullable=False),
        sa.Column("repository", sa.String(length=256), nullable=False),
        sa.Column("backend", sa.String(length=32), nullable=False),
        sa.Column("revision", sa.String(length=64), nullable=False),
        sa.Column("tests", sa.Integer(), nullable=False),
        sa.Column("functions", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_coverage_maps_repo", "coverage_maps", ["repository", "backend", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_coverage_maps_repo", table_name="coverage_maps")
    op.drop_table("coverage_maps")
