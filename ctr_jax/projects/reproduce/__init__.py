"""The CRT paper's claims at CPU scale, one study at a time: `python -m ctr_jax.projects.reproduce`.

`lib`: runs, their workdirs, ledgers and records; `studies` and `evaluated`: what each study
trains and how its section reads; `registry`: the studies by name and the driver.
"""
