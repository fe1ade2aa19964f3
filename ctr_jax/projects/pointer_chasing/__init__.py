"""Pointer chasing (reference section 7): the sweep over models and hops (`sweep`), checks of
the task and its constructions (`checks`, `layers`, `torch_check`), and `print_sweep`.
"""
