"""The app local batch workers (``sluice compute -w N``) run: a plain sluice App from settings.

Every sluice App registers the chunk task, so cluster workers of any app run batch items too.
"""

from sluice.app import App

app = App("sluice.compute")
app.conf.worker_direct = True  # infrastructure retries of a chunk go back to the same worker (sticky)
