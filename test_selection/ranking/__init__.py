"""How the selector orders test files and the tests inside them, and how it chooses.

The file rankers (``rankers``, the ``learned`` model over ``history``), the budget's rule
(``allocation``), the per-test ``test_model`` and its out-of-fold replay, and the backtest
that picks among them per repository by replaying its own past commits: its ``cases``,
the ``replay`` of one ranking over them, the ``choice`` between rankings, the
``agent_check`` and the ``cache`` on disk.
"""
