"""Client side of batch runs: ``sluice compute task.py`` (task file, driver, sink, local workers,
``--observe``, ``--traj``, torchrun)."""
