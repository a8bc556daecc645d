"""Code that runs inside a worker: the core (bootstep, request, watchdog, heartbeat, ledger,
reaper, health) and one subpackage per capability (``batch``, ``remote``)."""
