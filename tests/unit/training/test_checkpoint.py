"""training/checkpoint.py: ckpt.pt's layout as nanoGPT's (compiled models' names included), saves that fail or are
killed midway leave the previous ckpt.pt intact and no temporary file, and unreadable files get one line."""
import os
import random
import subprocess
import sys

import pytest
import torch

from helpers import tiny_gpt
from training import checkpoint as ckpt
from training.checkpoint import CheckpointError, load_checkpoint, load_model_state, save_checkpoint


def test_nanogpt_layout_and_compiled_names_load(tmp_path):
    """nanoGPT saves a compiled model's state dict as it is: every name prefixed with '_orig_mod.'."""
    model = tiny_gpt(0)
    assert {'transformer.wte.weight', 'transformer.wpe.weight', 'transformer.h.0.attn.c_attn.weight',
            'transformer.h.1.mlp.c_proj.bias', 'transformer.ln_f.weight', 'lm_head.weight'} <= set(model.state_dict())
    state = {'_orig_mod.' + k: v for k, v in model.state_dict().items()}
    (tmp_path / 'out').mkdir()
    torch.save({'model': state, 'model_args': dict(model.config.__dict__)}, tmp_path / 'out' / 'ckpt.pt')
    fresh = tiny_gpt(1)
    load_model_state(fresh, load_checkpoint(str(tmp_path / 'out'), 'cpu'), str(tmp_path / 'out'))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_model_args_of_the_later_speedrun_options_round_trip_through_a_checkpoint(tmp_path):
    """train.py's model_args record value_embeds, unet_skips, x0_shortcut, attn_window and doc_token, and the 4 Jan
    2025 record's value_scale, no_attn_layer, rope_truncated and attn_window_block; sample.py's load_model rebuilds
    the same model from them."""
    from training import configurator
    from training import rules
    config = {**configurator.train_defaults(), 'n_layer': 6, 'n_head': 2, 'n_embd': 16, 'block_size': 16,
              'device': 'cpu', 'dtype': 'float32', 'value_embeds': 2, 'unet_skips': True, 'x0_shortcut': True,
              'attn_window': 4, 'doc_token': 7, 'pos_emb': 'rope', 'value_scale': True, 'no_attn_layer': 3,
              'rope_truncated': True, 'attn_window_block': 2}
    model_args, _ = rules.model_args(config, 50)
    model = tiny_gpt(0, **model_args)
    save_checkpoint({'model': model.state_dict(), 'model_args': model_args}, str(tmp_path))
    loaded, _ = ckpt.load_model('resume', str(tmp_path), 'cpu')
    assert (loaded.config.value_embeds, loaded.config.unet_skips, loaded.config.x0_shortcut) == (2, True, True)
    assert (loaded.config.attn_window, loaded.config.doc_token) == (4, 7)
    assert (loaded.config.value_scale, loaded.config.no_attn_layer, loaded.config.rope_truncated,
            loaded.config.attn_window_block) == (True, 3, True, 2)
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    model.eval()
    assert torch.equal(loaded(x, x)[1], model(x, x)[1])


@pytest.mark.parametrize('error', [OSError(28, 'No space left on device'),
                                   RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 832')])
def test_a_save_that_fails_keeps_the_previous_checkpoint(tmp_path, monkeypatch, error):
    save_checkpoint({'model': {'w': torch.ones(3)}, 'model_args': {}}, str(tmp_path))
    before = (tmp_path / 'ckpt.pt').read_bytes()

    def full_disk(obj, f):
        f.write(b'partial')
        raise error
    monkeypatch.setattr(ckpt.torch, 'save', full_disk)
    with pytest.raises(CheckpointError) as e:
        save_checkpoint({'model': {'w': torch.zeros(3)}, 'model_args': {}}, str(tmp_path))
    message = str(e.value)
    assert message.startswith(f"could not write {tmp_path / 'ckpt.pt'} (") and '\n' not in message
    assert 'the previous ckpt.pt is intact; free disk space' in message
    assert os.listdir(tmp_path) == ['ckpt.pt'] and (tmp_path / 'ckpt.pt').read_bytes() == before


@pytest.mark.parametrize('hard_links', [True, False], ids=['hard link', 'no hard links'])
def test_keep_previous_keeps_the_replaced_checkpoint_as_ckpt_prev(tmp_path, monkeypatch, hard_links):
    """Another run's ckpt.pt, replaced by keep_previous's save, stays whole as ckpt.prev.pt (an older one replaced),
    whether the filesystem has hard links or not; without keep_previous a save keeps nothing."""
    if not hard_links:
        def no_links(source, target):
            raise OSError(1, 'Operation not permitted')  # exFAT's answer
        monkeypatch.setattr(ckpt.os, 'link', no_links)
    (tmp_path / 'ckpt.prev.pt').write_bytes(b'older')
    save_checkpoint({'model': {'w': torch.ones(3)}, 'model_args': {}, 'iter_num': 30}, str(tmp_path))
    other_run = (tmp_path / 'ckpt.pt').read_bytes()
    save_checkpoint({'model': {'w': torch.zeros(3)}, 'model_args': {}, 'iter_num': 2}, str(tmp_path),
                    keep_previous=True)
    assert (tmp_path / 'ckpt.prev.pt').read_bytes() == other_run
    assert torch.equal(load_checkpoint(str(tmp_path), 'cpu')['model']['w'], torch.zeros(3))
    save_checkpoint({'model': {'w': torch.full((3,), 2.0)}, 'model_args': {}, 'iter_num': 4}, str(tmp_path))
    assert (tmp_path / 'ckpt.prev.pt').read_bytes() == other_run  # a save without keep_previous leaves it
    assert sorted(os.listdir(tmp_path)) == ['ckpt.prev.pt', 'ckpt.pt']


def test_keep_previous_never_holds_three_checkpoints_and_a_failed_save_keeps_ckpt_pt(tmp_path, monkeypatch):
    """The older ckpt.prev.pt goes before the new file is written (two checkpoints on disk at most, as before); a
    save that fails after keep_aside renamed ckpt.pt (no hard links) puts it back, so a resume still finds it."""
    (tmp_path / 'ckpt.prev.pt').write_bytes(b'older')
    save_checkpoint({'model': {'w': torch.ones(3)}, 'model_args': {}, 'iter_num': 30}, str(tmp_path))
    other_run = (tmp_path / 'ckpt.pt').read_bytes()
    on_disk = []
    save = ckpt.torch.save
    monkeypatch.setattr(ckpt.torch, 'save', lambda obj, f: on_disk.append(sorted(os.listdir(tmp_path))) or save(obj, f))
    monkeypatch.setattr(ckpt.os, 'link', lambda source, target: (_ for _ in ()).throw(OSError(1, 'not permitted')))
    replace = os.replace

    def interrupted_rename(source, target):  # keep_aside's rename goes through; the new file's is interrupted
        if source.endswith('.tmp'):
            raise KeyboardInterrupt
        replace(source, target)
    monkeypatch.setattr(ckpt.os, 'replace', interrupted_rename)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({'model': {'w': torch.zeros(3)}, 'model_args': {}}, str(tmp_path), keep_previous=True)
    assert on_disk == [[f'.ckpt.pt.{os.getpid()}.tmp', 'ckpt.pt']]  # the older ckpt.prev.pt went before the write
    assert os.listdir(tmp_path) == ['ckpt.pt'] and (tmp_path / 'ckpt.pt').read_bytes() == other_run


def test_keep_previous_in_an_empty_out_dir_keeps_nothing(tmp_path):
    save_checkpoint({'model': {}, 'model_args': {}}, str(tmp_path), keep_previous=True)
    assert os.listdir(tmp_path) == ['ckpt.pt']


# seeded bytes: every pytest-xdist worker collects the same tests
@pytest.mark.parametrize('content, message', [(random.Random(0).randbytes(4096), 'is not a PyTorch checkpoint'),
                                              (b'', 'is not a PyTorch checkpoint')], ids=['random bytes', 'empty'])
def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path, content, message):
    (tmp_path / 'ckpt.pt').write_bytes(content)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path), 'cpu')
    assert message in str(e.value) and '\n' not in str(e.value) and 'weights_only' not in str(e.value)


def test_a_truncated_checkpoint_is_one_line(tmp_path):
    save_checkpoint({'model': {'w': torch.ones(1000)}, 'model_args': {}}, str(tmp_path))
    data = (tmp_path / 'ckpt.pt').read_bytes()
    (tmp_path / 'ckpt.pt').write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='truncated'):
        load_checkpoint(str(tmp_path), 'cpu')


def test_save_removes_temporaries_of_killed_saves_only(tmp_path):
    finished = subprocess.Popen([sys.executable, '-c', 'pass'])
    finished.wait()  # its pid now names no process: a save killed mid-write
    with subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']) as saving:  # another run, saving
        stale, live = tmp_path / f'.ckpt.pt.{finished.pid}.tmp', tmp_path / f'.ckpt.pt.{saving.pid}.tmp'
        stale.write_bytes(b'partial')
        live.write_bytes(b'in progress')
        save_checkpoint({'model': {}, 'model_args': {}}, str(tmp_path))
        saving.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, 'ckpt.pt'])
    assert live.read_bytes() == b'in progress'


def test_gpt2_weights_that_cannot_download_say_so_before_the_wait_and_name_the_folder_fix(monkeypatch, capsys):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, 'try_to_load_from_cache', lambda repo, name: None)  # not cached

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
    monkeypatch.setattr(ckpt.GPT, 'from_pretrained', offline)
    with pytest.raises(ckpt.ConfigError) as error:
        ckpt.pretrained_model('gpt2')
    assert "gpt2's weights are not in the Hugging Face cache: downloading them" in capsys.readouterr().out
    message = str(error.value)
    assert message.startswith("could not load the gpt2 weights (We couldn't connect")
    assert '--init_from=FOLDER' in message and 'pip install' not in message


def test_gpt2_weights_not_cached_under_hf_hub_offline_fail_at_once_naming_it(monkeypatch, capsys):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, 'try_to_load_from_cache', lambda repo, name: None)  # not cached
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(ckpt.GPT, 'from_pretrained', lambda *args, **kwargs: pytest.fail('a download was tried'))
    with pytest.raises(ckpt.ConfigError) as error:
        ckpt.pretrained_model('gpt2')
    assert 'downloading' not in capsys.readouterr().out
    assert str(error.value).startswith("gpt2's weights are not in the Hugging Face cache, and HF_HUB_OFFLINE is set")
    assert '--init_from=FOLDER' in str(error.value)


def test_gpt2_weights_without_transformers_say_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, 'transformers', None)  # import transformers raises ImportError
    with pytest.raises(ckpt.ConfigError, match='pip install transformers'):
        ckpt.pretrained_model('gpt2')


def test_the_gradients_an_optimizer_keeps_between_iterations_round_trip(tmp_path):
    """pending_gradients: by name, the gradients a model holds between iterations (gpt2026.py's Adam's, after an even
    iteration), none where every one is freed; restore_pending_gradients puts them back, on the parameters' device and
    dtype; a checkpoint without them restores none."""
    model = tiny_gpt(0)
    assert ckpt.pending_gradients(model) == {}
    kept = model.transformer.h[1].mlp.c_fc.weight
    kept.grad = torch.randn_like(kept)
    save_checkpoint({'model': model.state_dict(), 'model_args': {}, 'pending_gradients': ckpt.pending_gradients(model)},
                    str(tmp_path))
    fresh = tiny_gpt(1).double()
    ckpt.restore_pending_gradients(fresh, load_checkpoint(str(tmp_path), 'cpu'))
    assert [n for n, p in fresh.named_parameters() if p.grad is not None] == ['transformer.h.1.mlp.c_fc.weight']
    restored = fresh.transformer.h[1].mlp.c_fc.weight.grad
    assert restored.dtype == torch.float64 and torch.equal(restored.float(), kept.grad)
    ckpt.restore_pending_gradients(tiny_gpt(2), {'model': {}})


def test_the_saved_iteration_is_read_from_the_file_as_it_is_on_disk(tmp_path):
    """What Ctrl-C's line names: the file's iter_num, whatever this process last knew; None without a readable one."""
    assert ckpt.saved_iteration(str(tmp_path)) is None
    save_checkpoint({'model': {'w': torch.zeros(1000)}, 'model_args': {}, 'iter_num': 64}, str(tmp_path))
    assert ckpt.saved_iteration(str(tmp_path)) == 64
    (tmp_path / 'ckpt.pt').write_bytes(b'cut short')
    assert ckpt.saved_iteration(str(tmp_path)) is None


def test_optimizer_state_of_other_parameter_groups_names_the_key_to_resume_with(tmp_path):
    """Muon's groups follow muon_split_qkv and scalar_learning_rate: a resume that leaves one off (the speedrun
    presets set both) has other groups than the state it loads, which torch's load_state_dict refuses in a traceback."""
    from training import configurator, optim
    config = {**configurator.train_defaults(), 'optim': 'muon', 'out_dir': str(tmp_path)}
    model = tiny_gpt()
    saved = {**config, 'muon_split_qkv': True}
    checkpoint = {'optimizer': optim.build_optimizer(model, saved, 'cpu').state_dict(), 'config': saved}
    ckpt.load_optimizer(checkpoint, optim.build_optimizer(model, saved, 'cpu'), saved, 'ckpt.pt')
    with pytest.raises(CheckpointError, match=r"ckpt.pt holds optimizer state of other parameter groups than this "
                                              r"run's optimizer \(loaded state dict has a different number of "
                                              r"parameter groups\): resume with --muon_split_qkv=True"):
        ckpt.load_optimizer(checkpoint, optim.build_optimizer(model, config, 'cpu'), config, 'ckpt.pt')


def test_a_checkpoint_of_weights_that_are_not_finite_is_one_line(tmp_path):
    """A diverged run's, as nanoGPT's train.py saves it (this one stops first): refused when loaded, for sampling,
    export or a resume alike."""
    model = tiny_gpt()
    state = model.state_dict()
    state['transformer.h.1.mlp.c_fc.weight'][3, 5] = float('nan')
    save_checkpoint({'model': state, 'model_args': {}}, str(tmp_path))
    with pytest.raises(CheckpointError, match=r"ckpt.pt holds weights that are not finite "
                                              r"\(transformer.h.1.mlp.c_fc.weight has NaN or inf\)"):
        load_checkpoint(str(tmp_path), 'cpu')
