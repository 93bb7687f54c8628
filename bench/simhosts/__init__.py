"""Simulated hosts: many hosts in one process, speaking the real protocol.

Each simulated host is a real worker's objects (`services.worker`: its registration and
heartbeat, its `Consumer` of the host's and pool's queues, its `StageRunner` with its takes,
moves, claims and reconciles) whose commands are started by `SimLauncher` instead of the
host's: a command "runs" for a duration drawn from a distribution and exits 0, starting no
process. Beside it, a simulated supervisor (`supervisor.py`) beats, watches its worker's
registration and heartbeat (`WorkerWatch`), reconciles with the same queries as the real one,
and honours kills, freezes and the fence on the simulated commands.

What a real host would cost the control plane (PostgreSQL, RabbitMQ, Redis, the scheduler and
the api), a simulated one costs the same; what it costs itself (forks, bash, /proc, cgroups)
it does not. Hosts share a database pool and a broker connection per `--hosts-per-connection`:
the servers see fewer connections than real hosts would open (two each).

    python -m bench.simhosts --hosts 1000 --cpus 16 --duration exp:1
"""
