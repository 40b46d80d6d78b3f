"""Embedded PostgreSQL and Valkey servers for local development and tests."""
