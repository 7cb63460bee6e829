"""export_hf.py in a subprocess: a character model's tokenizer is its dataset's, one without its meta.pkl is
refused before writing, and train.py finetunes from the export."""
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from helpers import TINY_ARGS, run_script, write_char_dataset
from model import GPT, GPTConfig
from training.checkpoint import load_model
from training.meta import load_meta


ARGS = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, bias=True, vocab_size=40, dropout=0.0)


def trained_like_gpt(seed, tied=True, **args):
    """A GPT whose weights are random but not init-shaped (biases and LayerNorms nonzero), as after training."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**ARGS, **args}, tie_weights=tied))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def write_checkpoint(out_dir, model, prefix='', dtype=torch.float32, data_dir=None):
    os.makedirs(out_dir, exist_ok=True)
    state = {prefix + k: v.to(dtype) for k, v in model.state_dict().items()}
    config = {'data_dir': str(data_dir), 'dataset': 'tiny_char'} if data_dir else {}
    torch.save({'model': state, 'model_args': dict(model.config.__dict__), 'config': config},
               os.path.join(out_dir, 'ckpt.pt'))


def assert_same_model(ours, theirs):
    """Every position's logits (ours: the last position of each prefix) to 1e-5 in fp32, and greedy tokens equal."""
    torch.manual_seed(1)
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size))
    with torch.no_grad():
        their_logits = theirs(idx).logits
        our_logits = torch.cat([ours(idx[:, :t])[0] for t in range(1, idx.shape[1] + 1)], dim=1)
        torch.testing.assert_close(their_logits, our_logits, atol=1e-5, rtol=0)
        prompt = idx[:1, :4]
        greedy = theirs.generate(prompt, max_new_tokens=12, do_sample=False)
        assert torch.equal(greedy, ours.generate(prompt, 12, top_k=1))


def test_character_tokenizer_is_the_datasets(tmp_path):
    data = write_char_dataset(tmp_path / 'data')
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0), data_dir=tmp_path / 'data')
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}', f'--hf_dir={tmp_path / "hf"}')
    assert result.returncode == 0, result.stderr
    assert 'the tokenizer maps each character to its id as' in result.stdout
    meta = load_meta(str(data / 'meta.pkl'))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf')
    text = 'First Citizen:\nSpeak,  speak.\n'
    ids = tokenizer.encode(text)
    assert ids == [meta['stoi'][c] for c in text] and tokenizer.decode(ids) == text


def test_a_character_model_without_its_meta_is_refused_before_writing(tmp_path):
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0), data_dir=tmp_path / 'gone')
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}')
    assert result.returncode == 2 and result.stderr.count('\n') == 1
    assert "the model's vocab_size is 40, too small for GPT-2's tokens" in result.stderr
    assert not (tmp_path / 'out' / 'hf').exists()


def test_train_exports_and_finetunes_from_the_export(tmp_path):
    """The quick start's road: train, export, load in transformers; then train.py --init_from=the export."""
    write_char_dataset(tmp_path / 'data')
    common = [*TINY_ARGS, f'--data_dir={tmp_path / "data"}', '--eval_interval=5']
    result = run_script('train.py', *common, f'--out_dir={tmp_path / "out"}', '--max_iters=5')
    assert result.returncode == 0, result.stderr
    result = run_script('export_hf.py', f'--out_dir={tmp_path / "out"}')
    assert result.returncode == 0, result.stderr
    ours, _ = load_model('resume', str(tmp_path / 'out'), 'cpu')
    assert_same_model(ours, AutoModelForCausalLM.from_pretrained(tmp_path / 'out' / 'hf'))
    result = run_script('train.py', *common, f'--out_dir={tmp_path / "again"}', '--max_iters=2',
                        f'--init_from={tmp_path / "out" / "hf"}')
    assert result.returncode == 0, result.stderr
    assert f'Initializing from GPT-2 weights: {tmp_path / "out" / "hf"}' in result.stdout
