"""Sans-I/O scheduling core: policies, leases, accounting and the memory ledger.

Nothing in this package reads a clock, a socket or a file. Every entry point
takes ``now`` (CLOCK_MONOTONIC nanoseconds) and returns the effects the I/O
shell must carry out.
"""
