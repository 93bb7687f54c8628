"""The supervisor: one per host, watching every running process and the worker itself."""
