"""ctr_jax: the Context-Ready Transformer and implicit context updates, in JAX/Flax.

Import the parts you need, e.g. `from ctr_jax import models` and
`from ctr_jax.inference import decode`; `docs/design.md` maps the packages. Importing the package
itself has no side effects (no JAX device initialisation).
"""

__version__ = "0.1.0"
