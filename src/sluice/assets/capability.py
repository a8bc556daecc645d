"""The assets capability: every worker can run asset steps."""

from sluice.assets.step_task import RUN_STEP_TASK, run_step
from sluice.capability import Capability

ASSETS = Capability("assets", tasks={RUN_STEP_TASK: run_step})
