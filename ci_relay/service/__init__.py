"""The running service: the FastAPI application (``app``) and its read API (``api``), the
Celery tasks that run the pipeline's steps (``tasks``), the publisher that hands intake's
work to the broker (``publisher``), and how ``serve`` and ``worker`` start (``processes``).

Nothing below this package imports it: intake, the pipeline's steps, reporting and the
dashboard are plain modules the service wires together.
"""
