"""Client side of batch runs: ``sluice compute task.py`` (driver, sink, recovery, local workers,
``--observe``, ``--traj``, torchrun); the records and task file it shares with workers are
:mod:`sluice.tasks.batch`."""
