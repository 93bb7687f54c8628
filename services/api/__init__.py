"""The HTTP API (design §9): submit and inspect jobs, tasks and logs; health and metrics."""
