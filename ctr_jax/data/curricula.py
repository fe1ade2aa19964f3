"""The author's curricula for pointer chasing (reference 7.2): fewer keys per level, or fewer
table levels, in the first training steps.

A curriculum is written 'COUNT:UNTIL/COUNT:UNTIL/...' (config.data.key_curriculum and
config.data.hop_curriculum): examples of training step s have the COUNT of the first stage with
s < UNTIL, and the full task after the last stage. Parsed once at config time, so a bad
specification fails there with the field named.
"""

from ctr_jax.data.pointer_chasing import NUM_KEYS, check_hops


def _parse_stages(spec: str, name: str, unit: str, top: int) -> tuple[tuple[int, int], ...]:
  """'COUNT:UNTIL/...' -> ((count, until), ...), counts increasing in 1..top-1, ends increasing."""
  if not spec:
    return ()
  stages = []
  for part in str(spec).split('/'):
    try:
      count, until = (int(x) for x in part.split(':'))
    except ValueError:
      raise ValueError(f'{name} {spec!r}: write stages as {unit.upper()}S:UNTIL_STEP joined by '
                       "'/', e.g. '2:500/4:1000'") from None
    stages.append((count, until))
  counts, untils = zip(*stages)
  if not all(1 <= n < top for n in counts) or list(counts) != sorted(set(counts)):
    raise ValueError(f'{name} {spec!r}: the {unit} counts must increase, each in 1..{top - 1} '
                     f'(after the last stage every example has {top})')
  if untils[0] < 1 or list(untils) != sorted(set(untils)):
    raise ValueError(f'{name} {spec!r}: the stages\' end steps must increase, from >= 1')
  return tuple(stages)


def parse_key_curriculum(spec: str) -> tuple[tuple[int, int], ...]:
  """'2:500/4:1000' -> ((2, 500), (4, 1000)): 2 keys per level for steps [0, 500), 4 for
  [500, 1000), all 8 afterwards. '' -> () (no curriculum)."""
  return _parse_stages(spec, 'key_curriculum', 'key', NUM_KEYS)


def parse_hop_curriculum(spec: str, hops: int) -> tuple[tuple[int, int], ...]:
  """'1:500/2:1000' -> ((1, 500), (2, 1000)): examples with 1 table level for steps [0, 500),
  2 for [500, 1000), all `hops` afterwards (`pointer_chasing.batch(num_levels=...)`).
  '' -> () (no curriculum)."""
  return _parse_stages(spec, 'hop_curriculum', 'level', check_hops(hops))


def curriculum_keys(stages: tuple[tuple[int, int], ...], step: int) -> int:
  """Keys per level of the examples of training step `step` (0-based) under `stages`."""
  return next((keys for keys, until in stages if step < until), NUM_KEYS)


def curriculum_levels(stages: tuple[tuple[int, int], ...], step: int, hops: int) -> int:
  """Table levels of the examples of training step `step` (0-based) under `stages`."""
  return next((levels for levels, until in stages if step < until), hops)
