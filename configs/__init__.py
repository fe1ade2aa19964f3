"""Experiment configs: each file defines get_config(arg); every field is in ctr_jax/config_lib.py."""
