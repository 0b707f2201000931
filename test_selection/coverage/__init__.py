"""Per-test coverage maps: which functions each test executed, and how selection reads it.

``recorder`` is the pytest plugin that records a map (it runs inside the upstream's own
environment, so this package imports nothing outside the standard library and pytest),
``map`` the stored format and its index, ``select`` what a change's functions reach, and
``update`` which test files a change obliges a recording ``--since`` an older map to rerun.
"""
