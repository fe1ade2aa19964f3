"""Time budgets: a bench run that must end by a deadline (one device call) skips, with a note,
the items that would overrun their section's budget instead of being killed halfway.

Each item comes with an estimate of its seconds (compilation included) from a prior model of its
cost; once items of a kind have run, estimates of that kind are scaled by the median ratio of
measured to estimated seconds so far, so a wrong prior corrects itself after one item.
"""

import math
import statistics
import time


class Budget:
  """`sections`: {section: seconds} (0 or absent: no limit of its own); `total`: seconds for the
  whole run from now (0: none). A section's deadline is its budget from the moment it starts,
  and never later than the run's."""

  def __init__(self, sections: dict, total: float = 0.0, clock=time.monotonic):
    self.clock = clock
    self.start = clock()
    self.total = float(total or 0.0)
    self.sections = {name: float(s or 0.0) for name, s in dict(sections).items()}
    self.report = {}

  def deadline(self) -> float:
    return self.start + self.total if self.total > 0 else math.inf

  def section(self, name: str) -> 'Section':
    return Section(self, name, self.sections.get(name, 0.0))


class Section:
  """The budget of one section: `admit` before an item, `done` after it."""

  def __init__(self, budget: Budget, name: str, seconds: float):
    self.budget, self.name, self.seconds = budget, name, seconds
    self.start = budget.clock()
    own = self.start + seconds if seconds > 0 else math.inf
    self.deadline = min(own, budget.deadline())
    self.ratios = {}
    self.skipped = []
    budget.report[name] = {'budget_s': seconds or None, 'used_s': 0.0, 'skipped': 0}

  def left(self) -> float:
    return self.deadline - self.budget.clock()

  def estimate(self, kind: str, prior_seconds: float) -> float:
    """`prior_seconds` scaled by what items of `kind` (or, before any, of this section) took."""
    ratios = self.ratios.get(kind) or [r for rs in self.ratios.values() for r in rs]
    return prior_seconds * (statistics.median(ratios) if ratios else 1.0)

  def admit(self, label: str, kind: str, prior_seconds: float) -> str:
    """'' when the item fits in what is left, else the note that says why it is skipped."""
    left = self.left()
    if math.isinf(left):
      return ''
    estimate = self.estimate(kind, prior_seconds)
    if estimate <= left:
      return ''
    own_binds = self.seconds > 0 and self.start + self.seconds <= self.budget.deadline()
    whose = (f"the {self.name} section's {self.seconds:.0f} s budget" if own_binds
             else f"the run's {self.budget.total:.0f} s budget")
    note = (f'{label}: skipped, estimated {estimate:.0f} s with {max(left, 0):.0f} s left of '
            f'{whose}')
    self.skipped.append(note)
    self.budget.report[self.name]['skipped'] += 1
    return note

  def done(self, kind: str, prior_seconds: float, seconds: float) -> None:
    if prior_seconds > 0:
      self.ratios.setdefault(kind, []).append(seconds / prior_seconds)
    self.close()

  def close(self) -> None:
    self.budget.report[self.name]['used_s'] = self.budget.clock() - self.start
