"""hellaswag.py and train.py's HellaSwag evaluation, in subprocesses (two processes under torchrun too). The
command's scoring run needs tiktoken's gpt2 files cached (TIKTOKEN_CACHE_DIR) and is skipped otherwise."""
import json

import numpy as np
import pytest
import tiktoken
import torch

from helpers import HELLASWAG_EXAMPLES as EXAMPLES
from helpers import (MODERN_ARCH_ARGS, TINY_ARGS, gpt2_cached, patched_env, run_script, tiny_encoding, torchrun,
                     write_jsonl)
from model import GPT, GPTConfig
from training.checkpoint import save_checkpoint
from training.hellaswag import evaluate, read_examples


# -----------------------------------------------------------------------------
# the command

def score(*args):
    return run_script('hellaswag.py', '--device=cpu', '--dtype=float32', *args)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith('error: ') and result.stderr.count('\n') == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def save_tiny_checkpoint(out_dir, vocab_size):
    torch.manual_seed(0)
    model_args = dict(block_size=64, vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=16, bias=False, dropout=0.0)
    save_checkpoint({'model': GPT(GPTConfig(**model_args)).state_dict(), 'model_args': model_args}, out_dir)
    return out_dir


def test_command_bad_data_fails_in_one_line_before_loading_a_model(tmp_path):
    bad = tmp_path / 'val.jsonl'
    bad.write_text(json.dumps(EXAMPLES[0]) + '\n{"ctx": "A", "endings": ["a", "b", "c", "d"]}\n')
    # out_dir has no checkpoint: the data is checked first
    assert_one_line_error(score(f'--data_path={bad}', f'--out_dir={tmp_path}'), f'{bad} line 2', "'label'")
    assert_one_line_error(score(f'--data_path={tmp_path / "missing.jsonl"}'), 'cannot read', 'missing.jsonl')
    assert_one_line_error(score('--max_examples=-1'), 'max_examples')


def test_command_refuses_a_character_level_model(tmp_path):
    data = write_jsonl(tmp_path / 'val.jsonl', EXAMPLES)
    out_dir = save_tiny_checkpoint(tmp_path / 'out', vocab_size=65)
    assert_one_line_error(score(f'--data_path={data}', f'--out_dir={out_dir}'), "vocab_size is 65", "GPT-2's BPE")


@pytest.mark.skipif(not gpt2_cached(), reason="tiktoken's gpt2 files are not cached (set TIKTOKEN_CACHE_DIR)")
def test_command_scores_a_checkpoint_as_evaluate_does(tmp_path):
    data = write_jsonl(tmp_path / 'val.jsonl', EXAMPLES)
    out_dir = save_tiny_checkpoint(tmp_path / 'out', vocab_size=50304)
    result = score(f'--data_path={data}', f'--out_dir={out_dir}', '--max_examples=5', '--batch_size=2')
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(out_dir / 'ckpt.pt', weights_only=True)
    model = GPT(GPTConfig(**checkpoint['model_args']))
    model.load_state_dict(checkpoint['model'])
    expected = evaluate(model, read_examples(data, 5), tiktoken.get_encoding('gpt2'), 'cpu', batch_size=2)
    assert result.stdout.splitlines()[-1] == (
        f"hellaswag: 5 examples, acc {expected['acc']:.4f} ({expected['correct']}/5), "
        f"acc_norm {expected['acc_norm']:.4f} ({expected['correct_norm']}/5)")


# -----------------------------------------------------------------------------
# during training

def train_with_hellaswag(tmp_path, *args, processes=1):
    """train.py with --hellaswag=True on a GPT-2-vocabulary dataset (no meta.pkl) and EXAMPLES as the validation file,
    GPT-2's BPE replaced by the tiny encoding (no download)."""
    data = tmp_path / 'data'
    (data / 'bpe').mkdir(parents=True)
    ids = np.array(tiny_encoding().encode_ordinary(' '.join(e['ctx'] for e in EXAMPLES) * 20), dtype=np.uint16)
    ids.tofile(data / 'bpe' / 'train.bin')
    ids.tofile(data / 'bpe' / 'val.bin')
    (data / 'hellaswag').mkdir()
    write_jsonl(data / 'hellaswag' / 'hellaswag_val.jsonl', EXAMPLES)
    args = [*TINY_ARGS, f'--data_dir={data}', '--dataset=bpe', f'--out_dir={tmp_path / "out"}', '--hellaswag=True',
            '--block_size=64', '--max_iters=2', '--eval_interval=2', *args]
    if processes == 1:
        return run_script('train.py', *args, env=patched_env('tiny_bpe'))
    return torchrun(*args, processes=processes, env=patched_env('tiny_bpe'))


def hellaswag_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith('hellaswag ')]


@pytest.mark.parametrize('architecture', [[], MODERN_ARCH_ARGS], ids=['gpt2', 'modern'])
def test_train_py_scores_hellaswag_at_each_evaluation(tmp_path, architecture):
    # 4 of EXAMPLES are longer than 32 tokens: their contexts are cut
    result = train_with_hellaswag(tmp_path, '--block_size=32', *architecture)
    assert result.returncode == 0, result.stderr
    lines = hellaswag_lines(result.stdout)
    assert [line.split(':')[0] for line in lines] == ['hellaswag 0', 'hellaswag 2']
    [cut] = [line for line in result.stdout.splitlines() if 'longer than block_size' in line]  # once, not per eval
    assert cut.startswith('hellaswag: 4 of the 7 examples are longer than block_size=32')
    assert all(line.endswith(f'({len(EXAMPLES)} examples)') for line in lines)
    # the scores of the model checkpointed right after the evaluation at iteration 2
    model = GPT(GPTConfig(**torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)['model_args']))
    model.load_state_dict(torch.load(tmp_path / 'out' / 'ckpt.pt', weights_only=True)['model'])
    expected = evaluate(model, [dict(e) for e in EXAMPLES], tiny_encoding(), 'cpu')
    assert lines[1] == (f"hellaswag 2: acc {expected['acc']:.4f}, acc_norm {expected['acc_norm']:.4f} "
                        f"({len(EXAMPLES)} examples)")


def test_two_processes_score_hellaswag_as_one(tmp_path):
    single = train_with_hellaswag(tmp_path / 'single')
    double = train_with_hellaswag(tmp_path / 'double', '--gradient_accumulation_steps=2', processes=2)
    assert single.returncode == 0 and double.returncode == 0, double.stderr[-3000:]
    assert hellaswag_lines(double.stdout)[0] == hellaswag_lines(single.stdout)[0]  # the same model at iteration 0
