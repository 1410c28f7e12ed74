"""Claims as data: the claims file, what each kind of claim checks, and how a measurement judges it."""
