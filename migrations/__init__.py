"""Alembic migrations of the cloud database (SQLite and PostgreSQL)."""
