"""The worker: runs the stages of tasks on its host and hands processes to the supervisor."""
