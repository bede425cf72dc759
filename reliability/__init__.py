"""Reliability suites: long versions run from ``python -m reliability``; short ones in CI."""
