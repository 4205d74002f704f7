"""Integrations with other frameworks; each lives behind its own extra."""
