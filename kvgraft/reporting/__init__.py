"""Audit reports: building, validating and signing them, rendering them (terminal, HTML), and the renderers' parts."""
