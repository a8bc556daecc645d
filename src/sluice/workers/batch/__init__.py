"""Worker side of batch runs: the chunk task, and the app the runner's local workers serve."""

from celery.signals import task_failure

from sluice.capability import Capability
from sluice.tasks.batch import RUN_CHUNK_TASK
from sluice.workers.batch.chunk_task import record_chunk_failure, run_chunk

#: Batch runs: every worker can run chunks of any run; a chunk that fails for good records its items.
#: ``result_args=False`` keeps a task's arguments out of its stored state (a chunk's items are the
#: run's data, already in Redis); any task of the app may declare it.
BATCH = Capability(
    "batch",
    tasks={RUN_CHUNK_TASK: run_chunk},
    task_options={RUN_CHUNK_TASK: {"result_args": False}},
    accepted_task_options=("result_args",),
    signals=((task_failure, record_chunk_failure),),
)
