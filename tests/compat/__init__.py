"""Celery's own integration suite (``t/integration`` of the Celery version installed) run against
sluice: the runner (:mod:`tests.compat.celery_suite`) and the pytest plugin that makes the suite's
app a sluice App (:mod:`tests.compat.sluice_app`)."""
