"""Experiment code built on the library, kept out of it (as big_vision keeps projects in `proj/`).

Each module serves one driver in `scripts/` and may import anything in `ctr_jax`; nothing in the
library imports from here.
"""
