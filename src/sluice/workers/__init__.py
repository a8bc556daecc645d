"""Code that runs inside a worker: the core (bootstep, watchdog, heartbeat writer, reaper,
health) and one subpackage per capability (``batch``, ``remote``)."""
