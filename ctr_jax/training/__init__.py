"""Training: the trainer (`trainer.run`), its step (`train_step`: the recipe and the forward),
the optimiser, checkpoints, the workdir, metrics, sharding and multi-process set-up.

    python -m ctr_jax.main --config=configs/quickstart.py --workdir=/tmp/run
"""
