"""What the driver of a batch run and the workers running its chunks agree on: the chunk task's
name, the records of items (``records``) and the task file with its stored, signed form
(``taskfile``). The run's Redis keys are ``sluice.keys.run``."""

#: The chunk task: runs a list of items of one run and caches each item's record in Redis.
RUN_CHUNK_TASK = "sluice.compute.run_chunk"
