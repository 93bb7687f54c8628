"""Batch systems a pilot runs under: `slurm.py` submits, follows and cancels jobs
through Slurm's own commands."""
