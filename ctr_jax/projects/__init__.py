"""Studies built on the library, one package per study, kept out of it (as big_vision keeps
projects in `proj/`). Each runs as a module from the repository root, e.g.

    python -m ctr_jax.projects.reproduce --study=table1
    python -m ctr_jax.projects.pointer_chasing.sweep --hops=3
    python -m ctr_jax.projects.implicit_generation --config=configs/implicit_generation.py
    python -m ctr_jax.projects.conversion --config=configs/convert_pretrained.py
    python -m ctr_jax.projects.perf.matmul_dtypes

A project may import anything in ctr_jax; nothing in the library imports a project. Results go to
docs/ (json + a generated section, `ctr_jax.reporting.doc_sections`).
"""
