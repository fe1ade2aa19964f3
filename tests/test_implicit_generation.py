"""The generation experiment's machinery on a tiny untrained model (the real run is a script)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ctr_jax.projects.implicit_generation import experiment as generation
from ctr_jax.projects.implicit_generation import report
from helpers import family_lm


def test_metrics_of_identical_and_different_logits():
  a = jnp.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
  same = generation.step_metrics(a, a)
  assert same['agree'].all() and same['max_abs_logit'].max() == 0 and same['tvd'].max() == 0
  b = a.at[0, 0].set(5.0)
  moved = generation.step_metrics(a, b)
  assert moved['agree'].tolist() == [False, True] and moved['max_abs_logit'][0] == 5.0
  assert 0 < moved['tvd'][0] <= 1 and moved['tvd'][1] == 0


def test_teacher_forced_generation_report(tmp_path):
  model, variables, _ = family_lm('gemma', depth=2)
  prompts = [[1, 2, 3, 4], [5, 6]]
  tokens, lengths = generation.greedy_history(model, variables, prompts, 3)
  assert tokens.shape == (2, 7) and lengths.tolist() == [4, 2]
  # Each generated token is the argmax of the model with the whole history.
  full = np.asarray(jax.jit(model.apply)(variables, jnp.asarray(tokens)))
  assert tokens[0, 4] == full[0, 3].argmax() and tokens[1, 3] == full[1, 2].argmax()

  assert len(generation.settings_for('llama', 4, ['float32'], ['direct', 'stable'],
                                     ['materialise', 'action'])) == 6  # no 'stable' for llama
  assert len(generation.settings_for('gemma', 4, ['float32'], ['direct'],
                                     ['materialise', 'action'], (0,))) == 4
  settings = generation.settings_for('gemma', 2, ['float32'], ['stable'], ['materialise'])
  assert [(s.method, s.first_layer) for s in settings] == [('stable', 0), ('stable', 1)]
  baseline = generation.greedy_baseline(model, variables, prompts, 3)
  results = generation.evaluate(model, variables, baseline, settings, chunk=4)
  family = {'label': 'tiny Gemma', 'block': 'gemma', 'depth': 2, 'runs': [],
            'generated': {'float32': ['a', 'b']}}
  for setting, metrics in results.items():
    layers, _ = metrics.pop('layers'), metrics.pop('seconds')
    assert metrics['agree'].shape == (2, 3) and metrics['agree'].all()
    assert metrics['max_abs_logit'].max() <= 1e-4
    assert layers['dm_max'].shape == (2, 2, 3)
    where = generation.dm_layers(layers)
    assert len(where) == 2
    assert max(w['max_dm'] for w in where) == pytest.approx(float(metrics['dm_max'].max()))
    assert all(0 <= w['channel'] < model.spec.width and 'mu' in w for w in where)
    family['runs'].append({'setting': vars(setting), 'summary': generation.summarise(metrics),
                           'dm_layers': where,
                           'per_step': {k: v.tolist() for k, v in metrics.items()}})
  results = {'machine': generation.machine(), 'command': 'python x.py --flag', 'wall_s': 1.0,
             'prompts': ['p', 'q'], 'families': {'gemma': family}}
  doc = tmp_path / 'doc.md'
  doc.write_text('# Title\n\nkept\n')
  for _ in range(2):  # the second run replaces the section instead of appending it
    report.write_report(results, str(tmp_path), str(tmp_path / 'figures'),
                        figure_prefix='tiny', results_json=str(tmp_path / 'docs' / 'r.json'),
                        doc=str(doc), section='tiny')
  assert json.loads((tmp_path / 'docs' / 'r.json').read_text())['families']['gemma']['runs']
  assert (tmp_path / 'table.md').read_text().count('| tiny Gemma |') == 2
  assert (tmp_path / 'figures' / 'tiny_summary.png').exists()
  text = doc.read_text()
  assert text.startswith('# Title\n\nkept\n') and text.count(report.marker('tiny')) == 1
  assert 'python x.py --flag' in text and '87.5%' in text


def test_one_baseline_is_shared_by_every_setting():
  """Every setting of a dtype is compared against the same baseline logits (so the same
  top-2 margin), the ones of the greedy run that chose the tokens."""
  model, variables, _ = family_lm('gemma', depth=2)
  model, variables = generation.cast(model, variables, 'bfloat16')
  baseline = generation.greedy_baseline(model, variables, [[1, 2, 3, 4], [5, 6]], 3)
  settings = generation.settings_for('gemma', 2, ['bfloat16'], ['direct', 'stable'],
                                     ['materialise', 'action'])
  results = generation.evaluate(model, variables, baseline, settings, chunk=4)
  margins = [m['margin'] for m in results.values()]
  assert len(margins) == 8 and all(np.array_equal(margins[0], m) for m in margins)
  top2 = np.sort(np.asarray(baseline.logits, np.float32), axis=-1)[:, -2:]
  np.testing.assert_array_equal(margins[0].reshape(-1), top2[:, 1] - top2[:, 0])
  # The baseline's argmax is the token the greedy run appended.
  rows = np.argmax(baseline.logits, -1).reshape(2, 3)
  assert rows[0].tolist() == baseline.tokens[0, 4:7].tolist()
  assert rows[1].tolist() == baseline.tokens[1, 2:5].tolist()


def test_pretrained_config_arg_is_validated():
  from configs import implicit_generation as config_module
  config = config_module.get_config('model=gemma3_270m')
  assert config.prompt_format == 'plain' and config.doc_section == 'gemma3_270m'
  assert config_module.get_config('model=smollm2_135m').prompt_format == 'chatml'
  assert config_module.get_config('').doc_section == 'small_models'
  with pytest.raises(ValueError, match="model='gpt5'.*gemma3_270m"):
    config_module.get_config('model=gpt5')


def test_cluster_bootstrap_on_hand_computable_cases():
  # Equal clusters: every resample has the same mean, so the interval is the point.
  same = generation.cluster_bootstrap([0.9] * 5)
  assert same['mean'] == pytest.approx(0.9) and same['lo'] == same['hi'] == pytest.approx(0.9)
  # Two clusters 0 and 1: a resampled mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so
  # the 2.5% and 97.5% quantiles are 0 and 1 and the 30% and 70% quantiles both 1/2.
  two = generation.cluster_bootstrap([0.0, 1.0], resamples=20000)
  assert (two['mean'], two['lo'], two['hi'], two['n']) == (0.5, 0.0, 1.0, 2)
  middle = generation.cluster_bootstrap([0.0, 1.0], resamples=20000, level=0.4)
  assert middle['lo'] == middle['hi'] == 0.5


def test_interval_summary_pairs_methods_and_loops():
  def run(method, loop, agree):
    return {'setting': {'dtype': 'bfloat16', 'method': method, 'mode': 'action',
                        'first_layer': 0, 'loop': loop},
            'per_step': {'agree': agree, 'max_abs_logit': np.ones_like(agree, float).tolist()}}
  runs = [run('direct', 'closed', [[1, 1], [1, 0]]), run('direct', 'open', [[0, 0], [0, 0]]),
          run('stable', 'closed', [[1, 1], [1, 1]])]
  out = generation.interval_summary(runs, resamples=2000)
  assert out['runs']['bfloat16/direct/action/0/closed']['per_prompt_agreement'] == [1.0, 0.5]
  diffs = out['differences']
  stable = diffs['bfloat16/stable/action/0/closed - bfloat16/direct/action/0/closed']
  assert stable['agreement']['mean'] == pytest.approx(0.25)  # per prompt: 0 and +0.5
  assert (stable['agreement']['lo'], stable['agreement']['hi']) == (0.0, 0.5)
  opened = diffs['bfloat16/direct/action/0/open - bfloat16/direct/action/0/closed']
  assert opened['agreement']['mean'] == pytest.approx(-0.75) and len(diffs) == 2
  assert 'Verdict: In bfloat16' in report.verdict(out)


def test_open_and_closed_loop_from_a_separate_pass(tmp_path):
  """Both loops' patches, applied in a separate pass of the query alone, are exact in float64
  (the loops differ only by rounding); the closed loop's separate pass is its own pass."""
  with jax.enable_x64(True):
    model, variables, _ = family_lm('gemma', dtype='float64', depth=3)
    baseline = generation.greedy_baseline(model, variables, [[1, 2, 3, 4], [5, 6]], 3)
    settings = generation.settings_for('gemma', 3, ['float64'], ['direct', 'stable'],
                                       ['action'], first_layers=(0,), loops=('closed', 'open'))
    assert [(s.method, s.loop) for s in settings] == [
        ('direct', 'closed'), ('direct', 'open'), ('stable', 'closed'), ('stable', 'open')]
    results = generation.evaluate(model, variables, baseline, settings, separate_pass=True)
  for metrics in results.values():
    assert metrics['agree'].all() and metrics['max_abs_logit'].max() <= 1e-9
    assert metrics['layers'] == {}
  model, variables, _ = family_lm('gemma', depth=3)
  baseline = generation.greedy_baseline(model, variables, [[1, 2, 3, 4], [5, 6]], 3)
  closed = generation.settings_for('gemma', 3, ['float32'], ['direct'], ['action'],
                                   first_layers=(0,))
  own = generation.evaluate(model, variables, baseline, closed)[closed[0]]
  separate = generation.evaluate(model, variables, baseline, closed,
                                 separate_pass=True)[closed[0]]
  np.testing.assert_allclose(own['max_abs_logit'], separate['max_abs_logit'], atol=1e-5)

  family = {'label': 'tiny Gemma', 'block': 'gemma', 'depth': 3, 'runs': [],
            'generated': {'bfloat16': ['a', 'b']}}
  for setting, metrics in results.items():
    metrics = {k: v for k, v in metrics.items() if k not in ('layers', 'seconds')}
    family['runs'].append({'setting': vars(setting), 'summary': generation.summarise(metrics),
                           'per_step': {k: v.tolist() for k, v in metrics.items()}})
  family['intervals'] = generation.interval_summary(family['runs'], resamples=500)
  results = {'machine': 'm', 'command': 'python -m x --config=c:prompts=2', 'wall_s': 60.0,
             'prompts': ['p', 'q'], 'families': {'gemma': family},
             'intervals_run': {'loops': ['closed', 'open']}}
  text = report.doc_section(results, 'tiny', str(tmp_path))
  assert '| float64 | stable | open | - | 100.0 [100.0, 100.0] | 2/2 | 0 (0) |' in text
  assert 'python -m x --config=c:prompts=2' in text and '2 prompts × 3 greedy tokens' in text


def test_intervals_config_arg():
  from configs import implicit_generation as config_module
  config = config_module.get_config('model=gemma3_270m,prompts=20,tokens=50')
  prompts = tuple(config.hf_prompts)
  assert len(prompts) == 20 and len(set(prompts)) == 20 and config.num_tokens == 50
  assert prompts[:5] == config_module.PAPER_PROMPTS
  assert config.results_json == 'docs/implicit_generation/gemma3_270m_20x50.json'
  assert config.doc_section == 'gemma3_270m_20x50' and config.intervals
  assert tuple(config.loops) == ('closed', 'open') and tuple(config.first_layers) == (0,)
  assert config.separate_pass and tuple(config.modes) == ('action',)
  # The five-prompt run is as before: its json, section, prompts, tokens and settings.
  default = config_module.get_config('model=gemma3_270m')
  assert default.results_json == 'docs/implicit_generation/gemma3_270m.json'
  assert tuple(default.hf_prompts) == config_module.PAPER_PROMPTS and default.num_tokens == 20
  assert tuple(default.loops) == ('closed',) and not default.separate_pass
  assert tuple(default.first_layers) == () and not default.intervals
  assert default.workdir == '/tmp/implicit_generation_gemma3_270m'
  with pytest.raises(ValueError, match='need model='):
    config_module.get_config('prompts=20')
  with pytest.raises(ValueError, match='prompts=21'):
    config_module.get_config('model=gemma3_270m,prompts=21')
