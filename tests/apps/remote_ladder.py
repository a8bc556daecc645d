"""Workers for the remote escalation test: a small class whose slot cannot hold the retry, and a big one."""

from sluice import App, Compute, ResourceClass

app = App("tests.apps.remote_ladder", classes=[
    ResourceClass("rsmall", Compute(cpu="1", memory="288Mi"), slots=1),
    ResourceClass("rbig", Compute(cpu="1", memory="1Gi"), slots=1),
])
