"""Helpers shared by test modules (imported as ``tests.support.*``); fixtures are in ``tests/conftest.py``."""
