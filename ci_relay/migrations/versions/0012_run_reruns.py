"""run reruns: a run queued again by hand (POST /api/runs/{id}/rerun, ci-relay rerun, the run
page's button) names the run it recovers and whether only its failed shards run again

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("rerun_of", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("rerun_scope", sa.String(length=8), nullable=True))
        batch.create_foreign_key("fk_runs_rerun_of", "runs", ["rerun_of"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_rerun_of", type_="foreignkey")
        batch.drop_column("rerun_scope")
        batch.drop_column("rerun_of")
