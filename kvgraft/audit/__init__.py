"""The audit: plans, the run that executes them, the check kinds it runs, and the claims checker."""
