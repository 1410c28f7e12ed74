"""Audit plans, the audit run, reports, claims and verdict readings, their signatures and renderings."""
