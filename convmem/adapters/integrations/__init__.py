"""Integrations with agent frameworks: each takes the framework's own types and keeps its contract."""
