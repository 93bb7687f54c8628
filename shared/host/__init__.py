"""What runs on a worker host: cgroups, processes known by (pid, create time), a job's work
dir files, the marks that tie processes to their task, and self-fencing."""
