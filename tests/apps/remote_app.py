"""Workers for remote-call tests: a plain App on the default catalog (remote calls need no tasks)."""

from sluice import App

app = App("tests.apps.remote_app")
