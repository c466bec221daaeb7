"""A connection's bounds: what it holds for a client, and how much it does in one turn."""

from __future__ import annotations

__all__ = ("FLUSH_AT", "MAX_PENDING", "TURN_BUDGET")

#: Parsed requests waiting behind a response in flight before reading pauses.
MAX_PENDING = 16
#: Answers gathered in ``out`` are written once they reach this many bytes (else at the end of the
#: read that brought their requests): what a connection holds beyond the transport's buffer.
FLUSH_AT = 64 * 1024
#: Requests answered in one turn of the loop (one callback); the rest wait for the next turn, so a
#: client that pipelines thousands of requests delays the others by one turn's work at most.
TURN_BUDGET = 32
