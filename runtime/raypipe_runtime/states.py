"""A node's state in one request: PENDING -> RUNNING -> DONE | SKIPPED | FAILED."""

PENDING, RUNNING, DONE, SKIPPED, FAILED = "PENDING", "RUNNING", "DONE", "SKIPPED", "FAILED"

# The states a node never leaves.
SETTLED = (DONE, SKIPPED, FAILED)
