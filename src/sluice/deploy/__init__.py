"""Running sluice: the embedded Redis and the local cluster behind ``sluice up``."""
