"""The audit report: the document (build, validate, verdict) and its signature."""
