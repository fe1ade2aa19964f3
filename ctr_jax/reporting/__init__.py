"""What made a result and where it goes: the machine (`machine`, `cpu_name`: its name, a measured
matmul peak and memory rate; `peaks`: a device's peak FLOP/s for MFU, from a vendor table or
measured once and cached), paired timing (`timing`) and the generated sections of docs/
(`doc_sections`). Imports nothing else of ctr_jax, so every layer may use it.
"""
