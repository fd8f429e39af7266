"""The reliability suite: faults, bad input and abuse, measured (docs/reliability.md)."""
