"""Code that runs in the caller's process, one subpackage per capability (``batch``, ``remote``)."""
