"""Pure functions the models are built from: the fixed point and the decode scan
(`recurrence`), in one place.
"""
