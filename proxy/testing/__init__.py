"""Test doubles and demos: the fake upstream and the demo script."""
