"""Batch systems a pilot runs under (issue 40): `slurm.py` submits, follows and cancels jobs
through Slurm's own commands."""
