"""dashboard indexes: a commit page by sha (or prefix), a PR page, one test's history

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_changes_head", "changes", ["head_sha"], unique=False)
    op.create_index("ix_changes_repo_number", "changes", ["repository", "number"], unique=False)
    op.create_index("ix_results_nodeid", "test_results", ["nodeid"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_results_nodeid", table_name="test_results")
    op.drop_index("ix_changes_repo_number", table_name="changes")
    op.drop_index("ix_changes_head", table_name="changes")
