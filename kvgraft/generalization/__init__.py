"""The generalization audit: problems, the solution library, selection, leakage, answers, statistics, energy, controls."""
