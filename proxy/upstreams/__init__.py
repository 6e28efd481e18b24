"""Upstream clients: the port (``base``) and its implementations."""
