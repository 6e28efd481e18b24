"""Test doubles: fake upstreams on loopback."""
