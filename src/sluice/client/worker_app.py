"""The app local batch workers (``sluice compute -w N``) run: a plain sluice App from settings.

Every sluice App registers the chunk task, so cluster workers of any app run batch items too;
every worker consumes its own direct queue, which is where sticky retries of a chunk go.
"""

from sluice.app import App

app = App("sluice.compute")
