"""Preparation that scales with cores (issue 40.3) and one preparation per data dir (issue 41.3).

Tiny synthetic archives in the real layouts: the public `openwebtext.tar.xz`, the Hugging Face
mirror's `subsets/urlsf_subsetNN.tar` (tars of `.xz` tars), loose subsets; a Wikipedia dump whole
and in parts. The caches must not depend on the layout or the number of workers.
"""

import bz2
import glob
import itertools
import os
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest

from ctr_jax import config_lib
from ctr_jax.data import common, lock, openwebtext, parallel, pipeline, wikipedia
from ctr_jax.data import tokenizer as tokenizer_lib
from helpers import tar_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 300
WORDS = ('the river town of light and stone was founded by settlers who came from the north '
         'in spring with seeds tools and a great many questions about the sea').split()


def _text(seed: int, words: int = 60) -> str:
  rng = np.random.default_rng(seed)
  return ' '.join(WORDS[i] for i in rng.integers(0, len(WORDS), words)) + '.'



def _validation_name(subset: int) -> str:
  """The first document name of the subset that the name hash sends to validation."""
  return next(f'{subset:04d}-v{k}.txt' for k in itertools.count() if common.is_validation(
      f'urlsf_subset00-{subset}_data/{subset:04d}-v{k}.txt', openwebtext.VALIDATION_FRACTION))


def _subsets(count=6, docs=40):
  """{member name in the archive: xz tar of .txt documents}, one validation document each."""
  archives = {}
  for s in range(1, count + 1):
    members = {f'{s:04d}-{d}.txt': _text(s * 1000 + d).encode() for d in range(docs - 1)}
    members[_validation_name(s)] = _text(10**6 + s).encode()
    archives[f'openwebtext/urlsf_subset00-{s}_data.xz'] = tar_bytes(members, 'w:xz')
  return archives


def _owt_layouts(tmp_path):
  subsets = _subsets()
  archive = tmp_path / 'archive'
  archive.mkdir()
  (archive / openwebtext.ARCHIVE_NAME).write_bytes(tar_bytes(subsets, 'w:xz'))
  hf = tmp_path / 'hf' / 'subsets'
  hf.mkdir(parents=True)
  names = sorted(subsets)
  (hf / 'urlsf_subset00.tar').write_bytes(tar_bytes({n: subsets[n] for n in names[:4]}))
  (hf / 'urlsf_subset01.tar').write_bytes(tar_bytes({n: subsets[n] for n in names[4:]}))
  loose = tmp_path / 'loose'
  loose.mkdir()
  for name, data in subsets.items():
    (loose / os.path.basename(name)).write_bytes(data)
  return {'archive': archive, 'hf': tmp_path / 'hf', 'loose': loose}


def _caches(data_dir, name):
  files = sorted(glob.glob(os.path.join(data_dir, 'tokenizers', f'{name}_{VOCAB}_*.npy')))
  return {os.path.basename(f).split('_')[2]: np.load(f) for f in files}


def test_openwebtext_layouts_and_worker_counts_give_the_same_caches(tmp_path, capsys):
  layouts = _owt_layouts(tmp_path)
  assert openwebtext.find_inputs(layouts['hf'])[0] == 'subsets'
  docs = {k: list(openwebtext.iter_documents(v)) for k, v in layouts.items()}
  assert len(docs['archive']) == 240
  assert docs['archive'] == docs['hf'] == docs['loose']  # the mirror's tars of .xz tars read
  # One tokenizer for all, so that the caches can be compared.
  shared = tmp_path / 'tok'
  first = pipeline.load('openwebtext', shared, layouts['archive'], VOCAB, num_workers=1)
  reference = _caches(shared, 'openwebtext')
  assert first.train_tokens.dtype == np.uint16  # the vocabulary fits
  out = capsys.readouterr().out
  assert 'ctr_jax: prepared openwebtext:' in out and 'MB/s (1 worker)' in out
  for layout, workers in (('archive', 2), ('hf', 2), ('hf', 1), ('loose', 3)):
    data_dir = tmp_path / f'{layout}_{workers}' / 'data'
    (data_dir / 'tokenizers').mkdir(parents=True)
    tok = tokenizer_lib.tokenizer_path('openwebtext', VOCAB, shared)
    (data_dir / 'tokenizers' / os.path.basename(tok)).write_bytes(open(tok, 'rb').read())
    pipeline.load('openwebtext', data_dir, layouts[layout], VOCAB, num_workers=workers)
    caches = _caches(data_dir, 'openwebtext')
    assert caches.keys() == reference.keys() == {'train', 'validation'}
    for split in caches:
      np.testing.assert_array_equal(caches[split], reference[split], err_msg=f'{layout} {split}')
    assert not glob.glob(str(data_dir / 'tokenizers' / '.*'))  # no part files left
  # The validation split is in name-hash order, the train split in corpus order.
  eot = first.tokenizer.eot_id
  assert np.sum(first.validation_tokens == eot) == 6
  assert np.sum(first.train_tokens == eot) == 234


def test_an_old_int32_cache_is_still_read(tmp_path):
  data_dir = tmp_path / 'data'
  ds = pipeline.load('kjv_bible', data_dir, vocab_size=VOCAB)
  assert ds.train_tokens.dtype == np.uint16
  expected = np.array(ds.train_tokens)
  for path in glob.glob(str(data_dir / 'tokenizers' / '*.npy')):
    np.save(path, np.load(path).astype(np.int32))
  again = pipeline.load('kjv_bible', data_dir, vocab_size=VOCAB)
  assert again.train_tokens.dtype == np.int32
  np.testing.assert_array_equal(again.train_tokens, expected)
  batch = next(pipeline.train_iterator(again, seq_len=8, global_batch_size=2))
  assert batch.dtype == np.int32


def test_workers_hand_out_more_after_a_slow_first_result():
  """A slow first task lets the other results fill the waiting room (4 per worker); once they
  are all yielded nothing is in flight, and the pool must hand out the rest, not wait (it used
  to wait forever: the intermittent hang of the Wikipedia test below)."""
  pool = parallel._Workers(2, time.sleep, (0,))
  tasks = [(1.0,)] + [(0,)] * 20
  results = []

  def consume():
    try:
      results.extend(pool.run(time.sleep, iter(tasks), str))
    except RuntimeError as e:  # the pool was killed below: it hung
      results.append(e)

  thread = threading.Thread(target=consume, daemon=True)
  thread.start()
  thread.join(timeout=60)
  hung = thread.is_alive()
  pool.close(kill=hung)
  thread.join(timeout=30)
  assert not hung and results == [None] * len(tasks)


def test_token_dtype_and_worker_count():
  assert parallel.token_dtype(65536) == np.uint16
  assert parallel.token_dtype(65537) == np.int32
  assert parallel.resolve_workers(3) == 3
  assert parallel.resolve_workers(0) == len(os.sched_getaffinity(0))
  with pytest.raises(ValueError, match='config.data.num_workers=-1'):
    parallel.resolve_workers(-1)


@pytest.mark.parametrize('workers', [1, 2])
def test_a_damaged_archive_is_one_line_naming_it_and_writes_no_cache(tmp_path, workers):
  layouts = _owt_layouts(tmp_path)
  # A truncated inner subset inside the mirror's tar (read by a worker), and a truncated outer
  # archive (read by this process).
  hf_tar = layouts['hf'] / 'subsets' / 'urlsf_subset01.tar'
  members = {}
  with tarfile.open(hf_tar) as tar:
    for m in tar.getmembers():
      members[m.name] = tar.extractfile(m).read()
  name = sorted(members)[-1]
  members[name] = members[name][:len(members[name]) // 2]
  hf_tar.write_bytes(tar_bytes(members))
  archive = layouts['archive'] / openwebtext.ARCHIVE_NAME
  archive.write_bytes(archive.read_bytes()[:-200])
  for layout, where in (('hf', f'urlsf_subset01.tar:{name}'), ('archive', str(archive))):
    data_dir = tmp_path / f'data_{layout}'
    with pytest.raises(ValueError) as e:
      pipeline.load('openwebtext', data_dir, layouts[layout], VOCAB, num_workers=workers,
                    max_tokenizer_train_bytes=2000)
    message = str(e.value)
    assert '\n' not in message and where in message and 'is damaged' in message, message
    assert 'no token cache was written' in message
    assert not glob.glob(str(data_dir / 'tokenizers' / '*.npy'))
    assert not glob.glob(str(data_dir / 'tokenizers' / '.*'))


def test_wrong_files_and_lfs_pointers_are_refused_before_any_work(tmp_path):
  (tmp_path / 'lfs' / 'subsets').mkdir(parents=True)
  (tmp_path / 'lfs' / 'subsets' / 'urlsf_subset00.tar').write_text(
      'version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 652000000\n')
  (tmp_path / 'wrong').mkdir()
  (tmp_path / 'wrong' / 'urlsf_subset00.tar').write_bytes(tar_bytes({'train.parquet': b'PAR1'}))
  (tmp_path / 'cut').mkdir()
  whole = tar_bytes({n: d for n, d in list(_subsets(count=2).items())})
  (tmp_path / 'cut' / 'urlsf_subset00.tar').write_bytes(whole[:len(whole) // 1024 * 512])
  for manual, expected in (('lfs', 'is a Git LFS pointer'), ('wrong', "holds 'train.parquet'"),
                           ('cut', 'urlsf_subset00.tar is damaged .*truncated')):
    data_dir = tmp_path / f'data_{manual}'
    with pytest.raises(ValueError, match=expected) as e:
      pipeline.load('openwebtext', data_dir, tmp_path / manual, VOCAB)
    assert '\n' not in str(e.value)
    assert not os.path.exists(data_dir / 'tokenizers')  # nothing was done


# ------------------------------------------------------------------------------------------------
# Wikipedia: a whole dump cut into chunks of pages here, parts read by workers.
# ------------------------------------------------------------------------------------------------

_NS = 'http://www.mediawiki.org/xml/export-0.11/'


def _pages(first, count):
  pages = []
  for i in range(first, first + count):
    text = f"'''Article {i}''' is about [[{WORDS[i % len(WORDS)]}|a thing]]. {_text(i)}{{{{stub}}}}"
    ns = 1 if i % 7 == 0 else 0
    pages.append(f'<page><title>Article {i}</title><ns>{ns}</ns><id>{i}</id><revision><id>1'
                 f'</id><text xml:space="preserve">{text}</text></revision></page>\n')
  return ''.join(pages)


def _dump(pages: str) -> bytes:
  head = f'<mediawiki xmlns="{_NS}" version="0.11">\n<siteinfo><sitename>W</sitename></siteinfo>\n'
  return bz2.compress((head + pages + '</mediawiki>\n').encode())


def test_wikipedia_whole_dump_chunks_and_parts_give_the_same_articles(tmp_path, monkeypatch):
  whole = tmp_path / 'whole'
  whole.mkdir()
  (whole / 'enwiki-20240101-pages-articles-multistream.xml.bz2').write_bytes(
      _dump(_pages(1, 120)))
  parts = tmp_path / 'parts'
  parts.mkdir()
  for k, first in enumerate((1, 41, 81), start=1):
    (parts / f'enwiki-20240101-pages-articles{k}.xml-p{first}p{first + 39}.bz2').write_bytes(
        _dump(_pages(first, 40)))
  monkeypatch.setattr(wikipedia, 'CHUNK_BYTES', 3000)  # cut here, in this process
  units = list(wikipedia.iter_units(whole))
  assert len(units) > 3 and all(u[0] == 'xml' for u in units)
  articles = list(wikipedia.iter_articles(whole))
  assert articles == list(wikipedia.iter_articles(parts))
  assert len(articles) == 120 - 120 // 7
  shared = tmp_path / 'data_whole_1'
  pipeline.load('wikipedia', shared, whole, VOCAB, num_workers=1)
  reference = _caches(shared, 'wikipedia')
  tok = tokenizer_lib.tokenizer_path('wikipedia', VOCAB, shared)
  for manual, workers in ((whole, 2), (parts, 2)):
    data_dir = tmp_path / f'data_{manual.name}_{workers}'
    (data_dir / 'tokenizers').mkdir(parents=True)
    (data_dir / 'tokenizers' / os.path.basename(tok)).write_bytes(open(tok, 'rb').read())
    pipeline.load('wikipedia', data_dir, manual, VOCAB, num_workers=workers)
    caches = _caches(data_dir, 'wikipedia')
    for split in reference:
      np.testing.assert_array_equal(caches[split], reference[split])


def test_a_damaged_wikipedia_dump_is_one_line(tmp_path):
  manual = tmp_path / 'manual'
  manual.mkdir()
  dump = _dump(_pages(1, 60))
  path = manual / 'enwiki-20240101-pages-articles-multistream.xml.bz2'
  path.write_bytes(dump[:len(dump) // 2])
  with pytest.raises(ValueError, match=f'{path} is damaged .*download it again') as e:
    pipeline.load('wikipedia', tmp_path / 'data', manual, VOCAB, num_workers=1,
                  max_tokenizer_train_bytes=500)
  assert '\n' not in str(e.value)


# ------------------------------------------------------------------------------------------------
# Through the CLI: MB/s as it goes, two preparations of one empty data dir, cloud data dirs.
# ------------------------------------------------------------------------------------------------


def _prepare_command(data_dir, workdir, *extra):
  return [sys.executable, '-m', 'ctr_jax.main', '--config=configs/quickstart.py',
          '--config.job=prepare', f'--config.data.data_dir={data_dir}',
          f'--config.model.vocab_size={VOCAB}', f'--workdir={workdir}', *extra]


ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': ROOT}


@pytest.mark.slow
def test_prepare_job_on_both_openwebtext_layouts_reports_mb_per_s(tmp_path):
  layouts = _owt_layouts(tmp_path)
  for layout in ('archive', 'hf'):
    result = subprocess.run(
        _prepare_command(tmp_path / f'data_{layout}', tmp_path / f'w_{layout}',
                         '--config.data.name=openwebtext', '--config.data.num_workers=2',
                         '--config.data.seq_len=8', '--config.batch_size=2',
                         f'--config.data.manual_dir={layouts[layout]}'),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'ctr_jax: prepared openwebtext:' in result.stdout
    assert 'MB/s (2 workers); 240 documents' in result.stdout, result.stdout


def test_two_prepare_jobs_on_one_empty_data_dir_both_succeed(tmp_path):
  """Issue 41.3: they used to race in TFDS ("Cannot rename ... already exists", exit 3)."""
  data_dir = tmp_path / 'shared_data'
  procs = [subprocess.Popen(_prepare_command(data_dir, tmp_path / 'A' / name), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name in ('a', 'b')]
  results = [(p.wait(timeout=400), *p.communicate()) for p in procs]
  for code, out, err in results:
    assert code == 0, err[-3000:]
  assert sum('is being prepared by' in err for _, _, err in results) <= 1
  assert len(glob.glob(str(data_dir / 'tokenizers' / f'kjv_bible_{VOCAB}_*.npy'))) == 2
  assert not os.path.exists(data_dir / lock.LOCK_NAME) or not open(
      data_dir / lock.LOCK_NAME).read()  # released: the file names no holder


@pytest.mark.slow
def test_the_data_dir_lock_makes_the_second_process_wait(tmp_path):
  """A held lock: the second preparation says it waits, and goes on once it is released."""
  data_dir = tmp_path / 'data'
  with lock.preparing(data_dir):
    proc = subprocess.Popen(_prepare_command(data_dir, tmp_path / 'w'), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
      if proc.poll() is not None:
        break
      try:
        proc.wait(timeout=0.1)
      except subprocess.TimeoutExpired:
        pass
      if proc.poll() is None and _waiting(proc):
        break
    assert proc.poll() is None, proc.communicate()
  out, err = proc.communicate(timeout=400)
  assert proc.returncode == 0, err[-3000:]
  assert f'{data_dir} is being prepared by host' in err and 'waited' in err


def _waiting(proc) -> bool:
  # /proc/PID/wchan names the kernel function a process sleeps in: flock waits in a lock call.
  try:
    with open(f'/proc/{proc.pid}/wchan') as f:
      return 'lock' in f.read()
  except OSError:
    return False


def test_cloud_data_paths_are_refused_in_one_line(tmp_path):
  result = subprocess.run(
      _prepare_command(tmp_path / 'data', tmp_path / 'w', '--config.data.name=openwebtext',
                       '--config.data.data_dir=gs://bucket/data'),
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "ctr_jax: error: config.data.data_dir='gs://bucket/data' is on cloud storage"), lines
  assert not os.path.exists(tmp_path / 'w')
  config = config_lib.get_base()
  config.data.manual_dir = 'gs://bucket/raw'
  with pytest.raises(ValueError, match="config.data.manual_dir='gs://bucket/raw' is on cloud"):
    config_lib.validate(config)
  config.data.manual_dir = ''
  config.data.num_workers = -1
  with pytest.raises(ValueError, match='config.data.num_workers: must be an integer >= 0'):
    config_lib.validate(config)
