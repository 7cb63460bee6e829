"""Every card preset (config/*_<N>gb.py) trains through train.py as on a GPU: its own keys, the model scaled down,
under bf16 autocast, FlashAttention's variable-length kernel chosen as on CUDA and the optimizers built as on CUDA
(fused AdamW), on CPU stand-ins that refuse what the CUDA kernels refuse; an evaluation and a checkpoint included."""
import contextlib
import io
import math

import pytest

from training import configurator
from helpers import ROOT, logged_losses, patched_env, run_script, write_char_dataset
from training.card import preset_paths
from training.recipe import at_depth

# each preset's model at a CPU's scale: heads 16 wide (FlashAttention takes multiples of 8), 32-character windows
SCALED_DOWN = ['--init_from=scratch', '--dataset=tiny_char', '--n_layer=2', '--n_head=2', '--n_embd=32',
               '--block_size=32', '--batch_size=2', '--eval_batch_size=2', '--device=cpu', '--compile=False',
               '--hellaswag=False', '--wandb_log=False']
# as a GPU runs them: bf16 autocast; two iterations, each evaluated, the last one checkpointed
AS_ON_A_GPU = ['--dtype=bfloat16', '--max_iters=1', '--eval_interval=1', '--eval_iters=1', '--log_interval=1',
               '--always_save_checkpoint=True']


def preset_config(path):
    """The train.py config preset `path` sets (its own lines silent)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return configurator.load_config(configurator.train_keys(), [path])


def scaled_down(config):
    """The scaled-down preset's micro-steps (2 at most; 1 stays 1, as optimizer_in_backward needs), sliding window
    (in blocks of 4 where it counts blocks), documents (a newline, token 0, starts each), and a record's value tables
    and attention-less block at 2 layers, where it has them; gpt2026.py's model keeps the record's 11 layers."""
    keys = [f"--gradient_accumulation_steps={min(config['gradient_accumulation_steps'], 2)}"]
    if config['model_file'] == 'gpt2026.py':
        keys.append(f"--n_layer={config['n_layer']}")
    if config['doc_token'] >= 0:
        keys.append('--doc_token=0')
    if config['attn_window']:
        keys += ['--attn_window=16', '--attn_window_warmup_start=4']
    if config['attn_window_block']:
        keys.append('--attn_window_block=4')
    two_layers = at_depth(dict(config, n_layer=2))
    return keys + [f"--value_embeds={two_layers['value_embeds']}", f"--no_attn_layer={two_layers['no_attn_layer']}"]


# each preset as it is; the speedrun preset also with its window by position, the path of FlashAttention's kernel
# (a window in blocks runs the masked attention), and the 24 Nov 2024 record's value residual, whose fp32 lambda made
# the values fp32 under autocast: the kernel got them so and crashed on every GPU; and with its windows in blocks of
# 128, FlexAttention's path on CUDA
FLEX_SCALE = ('--block_size=384', '--batch_size=1', '--eval_batch_size=1', '--attn_window=256',
              '--attn_window_block=128', '--attn_window_warmup_start=128')
CASES = [(path, ()) for path in preset_paths(ROOT / 'config')] + \
        [(str(ROOT / 'config' / 'speedrun_gpt2_12gb.py'), ('--attn_window_block=0', '--value_residual=True')),
         (str(ROOT / 'config' / 'speedrun_gpt2_8gb.py'), FLEX_SCALE)]


@pytest.mark.parametrize('path, extra', CASES, ids=lambda case: case.rsplit('/', 1)[-1][:-3] if isinstance(case, str)
                         else ' '.join(case).lstrip('-') or 'as-is')
def test_card_preset_trains_under_bf16_autocast_on_the_cuda_kernels_stand_ins(tmp_path, path, extra):
    config = preset_config(path)
    write_char_dataset(tmp_path / 'data')
    env = patched_env('counted_flash_kernel', 'flex_as_on_cuda', 'optimizers_as_on_cuda')
    result = run_script('train.py', path, *SCALED_DOWN, *scaled_down(config), *extra, *AS_ON_A_GPU,
                        f'--data_dir={tmp_path / "data"}', f'--out_dir={tmp_path / "out"}', env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(logged_losses(result.stdout)) == [0, 1] and sorted(logged_losses(result.stdout, 'step')) == [0, 1]
    assert all(math.isfinite(loss) for loss in logged_losses(result.stdout).values())
    assert (tmp_path / 'out' / 'ckpt.pt').is_file()
    if config['model_file'] == 'model.py' and config['optim'] == 'adamw' and config['weight_dtype'] == 'float32':
        assert 'using fused AdamW: True' in result.stdout
    kernel_calls = int(result.stderr.rsplit('flash kernel calls: ', 1)[1].split()[0])
    by_position = not config['attn_window_block'] or '--attn_window_block=0' in extra  # FlashAttention's windows
    assert (kernel_calls > 0) == ((config['doc_token'] >= 0 or config['attn_window'] > 0) and by_position)
    flex_calls = int(result.stderr.rsplit('flex kernel calls: ', 1)[1].split()[0])
    assert (flex_calls > 0) == (extra == FLEX_SCALE)  # blocks of 128 (at the CPU's scale, 4: the masked attention)
