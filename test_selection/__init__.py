"""The four-stage test selector (change analysis, candidates, agent review, plan).

A pure library: no web, queue or database imports, so it can be tested and
benchmarked on its own and called by the relay service.
"""
