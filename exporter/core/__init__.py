"""What we compute, as pure functions over plain data: snapshots, windows, derivations, views.

No I/O, no clock, no logging here: the service layer feeds samples in and exposes the result.
"""
