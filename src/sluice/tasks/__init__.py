"""What a task is and what travels with it, imported by both sides and importing neither: the
ComputeTask base class (``base``) with its sending side (``bulk``, ``delay_many``) and the worker
side Celery reaches through it (``request``, the delivery ``ledger``); retry policy and
escalation (``retry``, ``escalation``), the attempt history, memory profiles, the memory-kill
record, the heartbeat payload, and each capability's contract (``remote``, ``batch``)."""
