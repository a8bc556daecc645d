"""Client-side pieces: batch runs over a task file (``sluice compute``)."""
