"""Initial schema: project, api_key, job, job_attempt, worker (notes/schema.md).

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 07:38:12.325245
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('project',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_project')),
    sa.UniqueConstraint('name', name=op.f('uq_project_name'))
    )
    op.create_table('worker',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('hostname', sa.Text(), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('queues', postgresql.ARRAY(sa.Text()), nullable=False),
    sa.Column('status', sa.Text(), server_default='running', nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_heartbeat_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('current_job_id', sa.Uuid(), nullable=True),
    sa.CheckConstraint("status IN ('running', 'stopping', 'stopped')", name=op.f('ck_worker_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_worker'))
    )
    op.create_table('api_key',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('project_id', sa.Uuid(), nullable=False),
    sa.Column('prefix', sa.Text(), nullable=False),
    sa.Column('key_hash', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['project_id'], ['project.id'], name=op.f('fk_api_key_project_id_project'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_key')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_key_key_hash'))
    )
    op.create_index(op.f('ix_api_key_project_id'), 'api_key', ['project_id'], unique=False)
    op.create_table('job',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('project_id', sa.Uuid(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('queue', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('tags', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.Column('status', sa.Text(), server_default='queued', nullable=False),
    sa.Column('request', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('result', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('error', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('progress', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('request_hash', sa.Text(), nullable=True),
    sa.Column('attempt', sa.Integer(), server_default='0', nullable=False),
    sa.Column('max_attempts', sa.Integer(), server_default='3', nullable=False),
    sa.Column('worker_id', sa.Text(), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('run_after', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.Column('priority', sa.Integer(), server_default='0', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("kind IN ('plan', 'analyze')", name=op.f('ck_job_kind')),
    sa.CheckConstraint("queue IN ('cpu', 'gpu')", name=op.f('ck_job_queue')),
    sa.CheckConstraint("status IN ('queued', 'running', 'cancelling', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_job_status')),
    sa.CheckConstraint('attempt >= 0', name=op.f('ck_job_attempt_non_negative')),
    sa.CheckConstraint('max_attempts >= 1', name=op.f('ck_job_max_attempts_positive')),
    sa.ForeignKeyConstraint(['project_id'], ['project.id'], name=op.f('fk_job_project_id_project'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job')),
    sa.UniqueConstraint('project_id', 'idempotency_key', name='uq_job_project_id_idempotency_key')
    )
    op.create_index('ix_job_claim', 'job', ['queue', 'status', sa.literal_column('priority DESC'), 'run_after', 'created_at'], unique=False, postgresql_where=sa.text("status = 'queued'"))
    op.create_index('ix_job_lease_expires_at', 'job', ['lease_expires_at'], unique=False, postgresql_where=sa.text("status IN ('running', 'cancelling')"))
    op.create_index(op.f('ix_job_name'), 'job', ['name'], unique=False)
    op.create_index(op.f('ix_job_project_id'), 'job', ['project_id'], unique=False)
    op.create_index('ix_job_project_id_created_at_id', 'job', ['project_id', 'created_at', 'id'], unique=False)
    op.create_table('job_attempt',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('job_id', sa.Uuid(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.Text(), nullable=False),
    sa.Column('claimed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('outcome', sa.Text(), nullable=True),
    sa.CheckConstraint("outcome IS NULL OR outcome IN ('succeeded', 'failed', 'cancelled', 'lease-lost', 'released', 'crashed')", name=op.f('ck_job_attempt_outcome')),
    sa.ForeignKeyConstraint(['job_id'], ['job.id'], name=op.f('fk_job_attempt_job_id_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_attempt')),
    sa.UniqueConstraint('job_id', 'attempt', name='uq_job_attempt_job_id_attempt')
    )


def downgrade() -> None:
    op.drop_table('job_attempt')
    op.drop_index('ix_job_project_id_created_at_id', table_name='job')
    op.drop_index(op.f('ix_job_project_id'), table_name='job')
    op.drop_index(op.f('ix_job_name'), table_name='job')
    op.drop_index('ix_job_lease_expires_at', table_name='job', postgresql_where=sa.text("status IN ('running', 'cancelling')"))
    op.drop_index('ix_job_claim', table_name='job', postgresql_where=sa.text("status = 'queued'"))
    op.drop_table('job')
    op.drop_index(op.f('ix_api_key_project_id'), table_name='api_key')
    op.drop_table('api_key')
    op.drop_table('worker')
    op.drop_table('project')
