"""Experiment configs: each module defines get_config(arg); see common.py for every field."""
