"""sample.py on the tiny run's checkpoint: text decoded with the dataset's meta.pkl, a FILE: prompt, the seed, and
one-line errors."""
import re
import shutil

import pytest
import torch

from helpers import MODERN_ARCH_ARGS, TEXT, TINY_ARGS, run_script, write_char_dataset


SEPARATOR = '\n---------------\n'


def sample(out_dir, *args):
    return run_script('sample.py', f'--out_dir={out_dir}', '--device=cpu', '--dtype=float32', '--num_samples=2',
                      '--max_new_tokens=40', *args)


def samples_of(stdout):
    """The generated texts: what follows the `Loading meta from ...` line, between the separators, before the line
    that gives the speed of the 2 x 40 tokens."""
    body = stdout.split('Loading meta from ', 1)[1].split('\n', 1)[1]
    texts = body.split(SEPARATOR)
    assert re.fullmatch(r'80 tokens in \d+\.\d\ds: \d+\.\d tokens/s\n', texts[-1]), texts[-1]
    return texts[:-1]


def test_samples_from_checkpoint_with_file_prompt(tiny_run, tmp_path):
    _, _, out_dir = tiny_run
    direct = sample(out_dir, '--start=First', '--seed=7')
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('First')
    from_file = sample(out_dir, f'--start=FILE:{prompt}', '--seed=7')
    assert direct.returncode == 0, direct.stderr
    assert from_file.returncode == 0, from_file.stderr
    texts = samples_of(direct.stdout)
    assert len(texts) == 2 and texts[0] != texts[1]
    for text in texts:
        assert text.startswith('First') and len(text) == len('First') + 40 and set(text) <= set(TEXT)
    assert samples_of(from_file.stdout) == texts  # same prompt, same seed: same samples


def test_samples_from_a_modern_architecture_checkpoint(tmp_path):
    """Rotary positions, soft-capped logits and the rest, as train.py saved them, generate as the default does."""
    write_char_dataset(tmp_path / 'data')
    trained = run_script('train.py', *TINY_ARGS, *MODERN_ARCH_ARGS, f'--data_dir={tmp_path / "data"}',
                         f'--out_dir={tmp_path / "out"}', '--max_iters=4', '--eval_interval=4')
    assert trained.returncode == 0, trained.stderr
    first, second = (sample(tmp_path / 'out', '--start=First', '--seed=7') for _ in range(2))
    assert first.returncode == 0, first.stderr
    texts = samples_of(first.stdout)
    assert len(texts) == 2 and all(text.startswith('First') and len(text) == len('First') + 40 for text in texts)
    assert samples_of(second.stdout) == texts


@pytest.mark.parametrize('case, args, message', [
    ('missing', [], 'no checkpoint at'),
    ('truncated', [], 'truncated'),
    ('unknown characters', ['--start=First%'], "does not know: '%'"),
    ('missing prompt file', ['--start=FILE:/nonexistent/prompt.txt'], 'cannot read the start file'),
    ('no samples', ['--num_samples=-1'], 'num_samples must be at least 1, got -1: e.g. --num_samples=10'),
    ('no new tokens', ['--max_new_tokens=-5'], 'max_new_tokens must be at least 1, got -5: e.g. --max_new_tokens=500'),
    ('more tokens than memory', ['--max_new_tokens=10000000000000'], "this run needs at least 74,505.8 GiB (a "
                                                                     "sample's tokens 74,505.8), more than"),
    ("another dataset's meta.pkl", [], "has vocab_size 13 but the model's is 34: it is not the dataset"),
    ('scratch', ['--init_from=scratch'], "init_from='scratch' is a model with random weights, nothing to sample"),
])
def test_errors_are_one_line(tiny_run, tmp_path, case, args, message):
    _, _, tiny_out = tiny_run
    out_dir = tmp_path / 'out'
    if case != 'missing':
        shutil.copytree(tiny_out, out_dir)
    if case == 'truncated':
        ckpt = out_dir / 'ckpt.pt'
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    if case == "another dataset's meta.pkl":  # the checkpoint's dataset, prepared again from other text
        checkpoint = torch.load(out_dir / 'ckpt.pt', weights_only=True)
        write_char_dataset(tmp_path / 'data', checkpoint['config']['dataset'], text='abcdefghijklm')
        checkpoint['config']['data_dir'] = str(tmp_path / 'data')
        torch.save(checkpoint, out_dir / 'ckpt.pt')
    result = sample(out_dir, *args)
    assert result.returncode == 2
    assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1, result.stderr
    assert message in result.stderr
