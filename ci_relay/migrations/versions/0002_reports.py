"""reports: outbox bookkeeping for the reporters, and HUD results other relays send us

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("key", sa.String(length=512), nullable=True))
        batch.add_column(sa.Column("result", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
        batch.create_index("ix_outbox_run_target", ["run_id", "target"], unique=False)
        batch.create_index("ix_outbox_target_key", ["target", "key"], unique=False)
    op.create_table(
        "crcr_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("verified_repo", sa.String(length=256), nullable=False),
        sa.Column("delivery_id", sa.String(length=128), nullable=False),
        sa.Column("workflow_name", sa.String(length=256), nullable=False),
        sa.Column("job_name", sa.String(length=256), nullable=False),
        sa.Column("check_run_id", sa.String(length=64), nullable=False),
        sa.Column("level", sa.String(length=16), nullable=True),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("conclusion", sa.String(length=32), nullable=True),
        sa.Column("upstream_repo", sa.String(length=256), nullable=True),
        sa.Column("head_sha", sa.String(length=64), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "verified_repo",
            "delivery_id",
            "workflow_name",
            "job_name",
            "check_run_id",
            name="uq_crcr_result_key",
        ),
    )
    op.create_index(
        "ix_crcr_results_repo", "crcr_results", ["verified_repo", "updated_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_crcr_results_repo", table_name="crcr_results")
    op.drop_table("crcr_results")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_index("ix_outbox_target_key")
        batch.drop_index("ix_outbox_run_target")
        batch.drop_column("sent_at")
        batch.drop_column("result")
        batch.drop_column("key")
