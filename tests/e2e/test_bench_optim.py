"""bench_optim.py on the tiny character set: its curves and optimizer state bytes, and the recipe's summary over
seeds."""
import json

import pytest

from helpers import run_script, write_char_dataset


def test_bench_optim_compares_optimizers_weight_precisions_and_the_autocast_cache(data_dir):
    """The same initial loss for every run; autocast's cache changes no loss; torch's AdamW on bf16 weights (rounding
    to nearest) keeps its moments in bf16, bf16_weights in fp32; Muon's state for the blocks' matrices is half of
    AdamW's (the step counters aside)."""
    runs = ['adamw', 'muon', 'bf16_weights', 'bf16_nearest', 'autocast_cache']
    result = run_script('bench_optim.py', f'--data_dir={data_dir}', '--dataset=tiny_char', '--n_layer=1',
                        '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4', '--max_iters=4',
                        '--eval_interval=2', '--eval_iters=2', '--lr_decay_iters=4', '--warmup_iters=1',
                        '--dtype=bfloat16', '--activation_checkpointing=True', f"--runs={','.join(runs)}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ['step', *runs])
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in rows] == ['0', '2', '4'] and len(set(rows[0][1:])) == 1
    assert all(row[1 + runs.index('autocast_cache')] == row[1] for row in rows)
    state = {line.split(':')[0]: line for line in lines[header + 4:]}
    total = {name: int(text.split('optimizer state ')[1].split(' ')[0].replace(',', ''))
             for name, text in state.items()}
    matrix_bytes = {name: int(text.split("blocks' matrices ")[1].split(' ')[0].replace(',', ''))
                    for name, text in state.items()}
    assert total['bf16_weights'] == total['adamw'] and total['bf16_nearest'] < 0.6 * total['adamw']
    assert matrix_bytes['adamw'] == 2 * matrix_bytes['muon'] + 4 * 4  # AdamW's 4 scalar step counters


def test_bench_optim_summarizes_the_runs_over_seeds(data_dir, tmp_path):
    """Two seeds, two steps: each run's curve is the mean of its seeds' curves. The baseline runs at each learning
    rate of baseline_lrs, and the one with the lowest mean final loss is the reference: it reaches its own final loss
    at the last step, and every run's step is measured against it. A run name out of RUNS, or a learning rate that is
    not one, is one line."""
    # 2 layers: the recipe's value-embedding table serves a first and a last block
    args = [f'--data_dir={data_dir}', '--dataset=tiny_char', '--n_layer=2', '--n_head=2', '--n_embd=32',
            '--block_size=16', '--batch_size=4', '--max_iters=2', '--eval_interval=1', '--eval_iters=2',
            '--lr_decay_iters=2', '--warmup_iters=1', '--seeds=1,2']
    out = tmp_path / 'bench.json'
    result = run_script('bench_optim.py', *args, '--runs=baseline,recipe,recipe-muon', '--baseline_lrs=1e-4,3e-2',
                        f'--json_path={out}')
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    names = ('baseline@1e-4', 'baseline@3e-2', 'recipe', 'recipe-muon')
    assert list(report['curves']) == list(names)
    for name in names:
        by_seed = report['seeds'][name]
        assert report['curves'][name] == {step: pytest.approx((by_seed['1'][step] + by_seed['2'][step]) / 2)
                                          for step in ('0', '1', '2')}
        assert report['summary'][name]['final_mean'] == pytest.approx(report['curves'][name]['2'])
    assert report['seeds']['recipe']['1'] != report['seeds']['recipe-muon']['1']
    assert report['seeds']['baseline@1e-4']['1']['0'] == report['seeds']['baseline@3e-2']['1']['0']  # same init
    # two steps at 1e-4 barely move the loss; at 3e-2 they do: the larger rate is the best of this sweep
    assert report['reference'] == 'baseline@3e-2'
    assert all(step is not None for step in report['summary']['baseline@3e-2']['reached'])
    assert report['summary']['baseline@1e-4']['reached'] == [None, None]
    assert "step reaching baseline@3e-2's final" in result.stdout
    assert "baseline@3e-2 is the baseline's best of --baseline_lrs=1e-4,3e-2: at the sweep's edge" in result.stdout
    result = run_script('bench_optim.py', *args, '--runs=baseline,recipe', '--baseline_lrs=', f'--json_path={out}')
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())['reference'] == 'baseline'  # an empty sweep: learning_rate alone
    result = run_script('bench_optim.py', *args, '--runs=baseline,recipe-nothing')
    assert result.returncode == 2 and "unknown run 'recipe-nothing'" in result.stderr
    result = run_script('bench_optim.py', *args, '--runs=baseline', '--baseline_lrs=1e-3,fast')
    assert result.returncode == 2 and "baseline_lrs: 'fast' is not a positive learning rate" in result.stderr


def test_bench_optim_runs_the_packed_layout_on_the_same_tokens(tmp_path):
    """recipe+packed reads rows of 4 blocks, the other runs the same rows split into blocks; a batch that does not fill
    whole rows is one line. The dataset's meta.pkl claims GPT-2's vocabulary, so <|endoftext|> is a token.
    recipe+window_warmup trains and evaluates with windows of 1, 8 and 16 at steps 0, 1 and 2: packed's at 2."""
    write_char_dataset(tmp_path, 'tiny_bpe', vocab_size=50304)
    args = [f'--data_dir={tmp_path}', '--dataset=tiny_bpe', '--n_layer=2', '--n_head=2', '--n_embd=32',
            '--block_size=16', '--max_iters=2', '--eval_interval=1', '--eval_iters=2', '--lr_decay_iters=2',
            '--warmup_iters=1', '--runs=recipe,recipe+documents,recipe+packed,recipe+window_warmup']
    out = tmp_path / 'bench.json'
    result = run_script('bench_optim.py', *args, '--batch_size=8', f'--json_path={out}')
    assert result.returncode == 0, result.stderr
    curves = json.loads(out.read_text())['curves']
    # no document starts in this data: attending within documents changes nothing; packing does
    assert curves['recipe+documents'] == curves['recipe'] and curves['recipe+packed'] != curves['recipe']
    assert all(curves['recipe+window_warmup'][step] != curves['recipe+packed'][step] for step in ('0', '2'))
    result = run_script('bench_optim.py', *args, '--batch_size=6')
    assert result.returncode == 2 and 'use a multiple of 4 for --batch_size' in result.stderr


@pytest.mark.parametrize('args, message', [(['--seeds=1,x'], "seeds='1,x': give whole numbers, comma-separated"),
                                           (['--runs=bogus'], "unknown run 'bogus': use some of ")])
def test_bad_input_is_one_line(args, message):
    result = run_script('bench_optim.py', *args)
    assert result.returncode == 2 and result.stderr.count('\n') == 1 and message in result.stderr, result.stderr
