"""Task-side pieces: the ComputeTask base class (``base``), retry policy and escalation as data
and pure functions (``retry``), ending an attempt (``escalation``) and the attempt history."""
