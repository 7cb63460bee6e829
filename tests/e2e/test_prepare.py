"""prepare/ scripts run as a user runs them, in subprocesses: from any directory, their default out_dir, one-line
errors, and Ctrl-C stopping forked workers."""
import subprocess
import sys

import numpy as np

from helpers import ROOT


CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n"
          "Caf\u00e9 \u00e0 la th\u00e9\u00e2tre.\n") * 3


def read_bin(path):
    assert path.stat().st_size % 2 == 0
    return np.fromfile(path, dtype=np.uint16)


def run_script(name, *args, cwd):
    return subprocess.run([sys.executable, str(ROOT / 'prepare' / f'{name}.py'), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_char_script_runs_from_any_directory(tmp_path):
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text(CORPUS, encoding='utf-8')
    result = run_script('shakespeare_char', '--input', str(corpus), '--out_dir', 'out', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f'length of dataset in characters: {len(CORPUS):,}' in result.stdout
    assert f'vocab size: {len(set(CORPUS)):,}' in result.stdout
    assert f'train has {int(len(CORPUS) * 0.9):,} tokens' in result.stdout
    assert len(read_bin(tmp_path / 'out' / 'train.bin')) + len(read_bin(tmp_path / 'out' / 'val.bin')) == len(CORPUS)


def test_default_out_dir_is_data_in_the_current_directory(tmp_path):
    """Where train.py, run from the same directory, reads --dataset=shakespeare_char (every path is relative to the
    current directory)."""
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text(CORPUS, encoding='utf-8')
    result = run_script('shakespeare_char', '--input', str(corpus), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / 'data' / 'shakespeare_char').iterdir()) == \
        ['meta.pkl', 'train.bin', 'val.bin']


def test_out_dir_that_is_a_file_is_one_line_and_writes_nothing(tmp_path):
    corpus, taken = tmp_path / 'corpus.txt', tmp_path / 'taken'
    corpus.write_text(CORPUS, encoding='utf-8')
    taken.write_text('a file')
    result = run_script('shakespeare_char', '--input', str(corpus), '--out_dir', str(taken), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: out_dir={str(taken)!r} cannot be a directory: {taken} is "
                                                  f"a file; use another --out_dir"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ['corpus.txt', 'taken'] and taken.read_text() == 'a file'


def test_failed_download_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / 'out'
    result = run_script('shakespeare_char', '--url', 'http://127.0.0.1:9/input.txt', '--out_dir', str(out),
                        cwd=tmp_path)
    assert result.returncode == 2
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and error.startswith('error: could not download')
    assert '--input PATH' in error
    assert not out.exists()


def test_openwebtext_script_rejects_a_budget_of_zero(tmp_path):
    result = run_script('openwebtext', '--max_tokens', '0', '--out_dir', 'out', cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == 'error: --max_tokens 0 must be at least 1 (e.g. 10_000_000_000)\n'
    assert not (tmp_path / 'out').exists()


def test_ctrl_c_stops_forked_workers_without_their_tracebacks(tmp_path):
    """Ctrl-C reaches the whole process group, as datasets' workers under num_proc > 1: one line, nothing else."""
    code = ('import multiprocessing, os, signal, time\n'
            'from prepare import common\n'
            'def work(_):\n'
            '    time.sleep(60)\n'
            'def main():\n'
            '    with multiprocessing.get_context("fork").Pool(2) as pool:\n'
            '        result = pool.map_async(work, range(2))\n'
            '        time.sleep(1)\n'
            '        os.killpg(0, signal.SIGINT)\n'
            '        result.get()\n'
            'common.run_main(main)\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            start_new_session=True)  # its own process group, which killpg(0) signals
    assert result.returncode == 130
    assert result.stderr == 'interrupted: no output written, temporary files removed\n'
