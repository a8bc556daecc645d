"""The one subpackage that knows kombu and Celery's Redis layout.

Everything else in sluice reaches the broker through the public functions of these modules:
the key layout (``layout``), the Lua script registry (``scripts``), bells (``bells``), the
dead-letter record (``letters``), moving a message to another queue (``moves``), the fetch
gate a packed worker installs (``gate``), publishing and events (``publishing``), the kombu
transport itself (``transport``, built from ``acks``, ``fetching``, ``forwarding`` and
``leases``) and Celery's Redis result backend (``result_backend``, ``result_consumer``).
"""
