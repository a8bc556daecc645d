"""pytest plugin for Celery's integration suite: the app its fixtures make (Celery's testing
``TestApp``, behind ``celery_app`` and ``celery_session_app``) is a :class:`sluice.App`, so the
session worker Celery's fixtures start (``start_worker``) is a sluice worker: its bootstep, its
transport, its router, its result backend. The suite's own configuration is added as defaults,
under sluice's choices (late acks, prefetch 1, JSON), as it is under a user's ``App``.

Loaded by ``python -m tests.compat.celery_suite --mode sluice`` (``-p tests.compat.sluice_app``).
"""

from __future__ import annotations

from celery.contrib.testing import app as testing_app

from sluice import App

# Celery's TestApp calls the Celery class by this module-level name; there is no parameter
# for the class, and the suite's fixtures call TestApp themselves.
testing_app.Celery = App
