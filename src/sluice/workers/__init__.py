"""Worker-side pieces: the bootstep, memory watchdog, heartbeat and request class."""
