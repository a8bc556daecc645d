"""The app the batch runner's local workers serve (``sluice compute -w N``): sluice's default app.

Every sluice App with the batch capability runs chunks, so cluster workers of any app run batch
items too; every worker consumes its own direct queue, which is where sticky retries go.
"""

from sluice.app import App

app = App.default()
