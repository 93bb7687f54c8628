"""Scheduling a shared pool: the one policy that decides which waiting tasks go to
which host, and why the others wait. Pure: inputs in, a plan out, no I/O, no clock.

- `resources`: amounts (CPU in millicores, memory, GPUs) and what they cost in CPUs.
- `fairshare`: decayed usage and each user's level, the order users are served in.
- `model`: what a round is given (hosts, waiting jobs, users, settings) and what it answers.
- `reasons`: why a job's tasks wait, with the numbers that say how far they are from running.
- `board`: a round's hosts, best-fit placement, GPU devices and reservations.
- `planner`: `plan()`, the round itself.

`docs/explanation/scheduling.md` gives the model, the formulas and the knobs; the leading
scheduler runs the planner each round (`services/scheduler/planning.py`).
"""
