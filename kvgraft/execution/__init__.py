"""Execution: where an audit's work units run (in-process or on Ray actors) and the journal they land in."""
