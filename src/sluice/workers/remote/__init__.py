"""Worker side of remote functions: the call and session tasks, sandboxes, package environments."""

from celery import signals

from sluice.capability import Capability
from sluice.tasks.remote.call import REMOTE_TASK, SESSION_TASK
from sluice.tasks.remote.classes import remote_catalog
from sluice.tasks.remote.settings import RemoteSettings
from sluice.workers.remote.bootstep import RemoteWorkerStep
from sluice.workers.remote.call_task import run_remote, run_session
from sluice.workers.remote.pools import close_retired

#: Remote functions: workers run signed calls in sandboxes; ``remote_classes`` must name classes.
REMOTE = Capability(
    "remote",
    tasks={REMOTE_TASK: run_remote, SESSION_TASK: run_session},
    bootsteps=(RemoteWorkerStep,),
    signals=((signals.task_postrun, close_retired),),
    settings=RemoteSettings,
    check=remote_catalog,
)
