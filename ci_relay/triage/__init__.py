"""Triage: whose fault a run's failures are (upstream, backend, infra, flake or unknown).

``verdict`` decides from what the checks saw (pure), ``bisect`` narrows a range to the first
bad commit, ``summary`` writes the paragraph (a template, or an LLM that cannot change the
category); the pipeline step :mod:`ci_relay.pipeline.triage` runs the checks.
"""
