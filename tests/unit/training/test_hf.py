"""training/hf.py: a checkpoint exported to a transformers folder computes the same logits and greedy tokens as the
GPT it came from (tied or not, with or without biases, bf16 weights, wrapped names), the gpt2 tokenizer is
tiktoken's, and a local GPT-2 folder is an init_from as the gpt2* names are."""
import json

import pytest
import tiktoken
import torch

import configurator
from helpers import HF_ARGS as ARGS
from helpers import assert_same_model, gpt2_cached, trained_like_gpt, write_char_dataset, write_checkpoint
from training import hf, rules
from training.checkpoint import load_checkpoint, load_model, pretrained_model
from training.errors import ConfigError






def export(out_dir, hf_dir, meta_path):
    """What export_hf.py does, in this process."""
    checkpoint = load_checkpoint(str(out_dir), 'cpu')
    hf.check_exportable(checkpoint, 'ckpt.pt')
    hf.export(checkpoint, hf.tokenizer_for(checkpoint['model_args'], meta_path), str(hf_dir))



@pytest.mark.parametrize('tied, bias, dtype, prefix', [
    (True, True, torch.float32, ''),
    (True, False, torch.float32, '_orig_mod.'),  # a compiled model's names
    (False, True, torch.bfloat16, 'module.'),  # DDP's names, bf16 weights (weight_dtype='bfloat16')
    (False, False, torch.bfloat16, 'module._orig_mod.'),
])
def test_export_computes_what_the_checkpoint_computes(tmp_path, tied, bias, dtype, prefix):
    data = write_char_dataset(tmp_path / 'data')
    model = trained_like_gpt(0, tied=tied, bias=bias)
    write_checkpoint(tmp_path / 'out', model, prefix, dtype)
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    model.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})  # what was saved
    from transformers import AutoModelForCausalLM, GPT2LMHeadModel  # here, not at collection: seconds to import
    for loader in (GPT2LMHeadModel, AutoModelForCausalLM):
        theirs = loader.from_pretrained(tmp_path / 'hf')
        assert isinstance(theirs, GPT2LMHeadModel) and theirs.config.tie_word_embeddings == tied
        assert_same_model(model, theirs)
    assert (tmp_path / 'hf' / 'model.safetensors').exists()


@pytest.mark.skipif(not gpt2_cached(), reason="tiktoken's gpt2 files are not cached (set TIKTOKEN_CACHE_DIR)")
def test_gpt2_tokenizer_is_tiktokens(tmp_path):
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0, vocab_size=50304, n_embd=8, n_head=1, n_layer=1))
    export(tmp_path / 'out', tmp_path / 'hf', None)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf')
    text = "Hello world, it's 2024!\n\n  The  end.<|endoftext|>"
    enc = tiktoken.get_encoding('gpt2')
    assert tokenizer.encode(text) == enc.encode(text, allowed_special='all')
    assert tokenizer.model_max_length == 16 and tokenizer.eos_token_id == 50256


def test_architecture_keys_gpt2_lacks_are_one_line(tmp_path, monkeypatch):
    model = trained_like_gpt(0)
    checkpoint = {'model': model.state_dict(), 'model_args': {**ARGS, 'rotary': True, 'qk_norm': True}}
    with pytest.raises(ConfigError) as e:
        hf.check_exportable(checkpoint, 'ckpt.pt')
    assert str(e.value) == ('ckpt.pt cannot be exported as a GPT2LMHeadModel: it has no counterpart for '
                            'rotary=True, qk_norm=True')
    # modded-nanogpt's later records' options: tables and weights a GPT2LMHeadModel has no place for; off, GPT-2
    later = {'value_embeds': 3, 'unet_skips': True, 'x0_shortcut': True, 'attn_window': 1024}
    with pytest.raises(ConfigError, match='no counterpart for value_embeds=3, unet_skips=True, x0_shortcut=True, '
                                          'attn_window=1024$'):
        hf.check_exportable({'model_args': {**ARGS, **later}}, 'ckpt.pt')
    hf.check_exportable({'model_args': {**ARGS, **dict.fromkeys(later, 0)}}, 'ckpt.pt')
    # a GPTConfig field GPT-2 cannot express exports at its default and is refused at any other value
    monkeypatch.setattr(hf, 'EXPRESSIBLE_KEYS', tuple(k for k in hf.EXPRESSIBLE_KEYS if k != 'bias'))
    hf.check_exportable({'model_args': dict(ARGS, bias=True)}, 'ckpt.pt')
    with pytest.raises(ConfigError, match='no counterpart for bias=False$'):
        hf.check_exportable({'model_args': dict(ARGS, bias=False)}, 'ckpt.pt')


def save_hf(path, weights=True, **config):
    """A GPT2LMHeadModel of 2 layers, 32 wide, config overriding, saved to path (its config.json alone if not
    weights). transformers imported here, not at collection: seconds to import."""
    from transformers import GPT2Config, GPT2LMHeadModel
    if not weights:
        return GPT2Config(n_layer=1).save_pretrained(path)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**{'n_layer': 2, 'n_head': 2, 'n_embd': 32, 'n_positions': 32,
                                          'vocab_size': 50257, **config})).eval()
    model.save_pretrained(path)
    return model


def test_init_from_a_folder_is_that_model(tmp_path):
    theirs = save_hf(tmp_path / 'hf', activation_function='gelu')  # nn.GELU's function: exact agreement
    ours, train_config = load_model(str(tmp_path / 'hf'), 'unused', 'cpu')
    assert train_config == {} and ours.config.block_size == 32 and ours.config.bias
    assert_same_model(ours, theirs)
    # OpenAI's tanh GELU ('gelu_new', distilgpt2's) loads as gpt2* does
    save_hf(tmp_path / 'distil')
    assert pretrained_model(str(tmp_path / 'distil')).config.n_layer == 2


def test_export_then_init_from_gives_the_same_weights(tmp_path):
    data = write_char_dataset(tmp_path / 'data')
    model = trained_like_gpt(0)
    write_checkpoint(tmp_path / 'out', model)
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    back = pretrained_model(str(tmp_path / 'hf'), dropout=0.1, activation_checkpointing=True)
    assert back.config.dropout == 0.1 and back.activation_checkpointing  # GPT's options reach the model
    assert back.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


def train_config(tmp_path, init_from, **keys):
    """train.py's config for init_from on a character dataset in tmp_path."""
    write_char_dataset(tmp_path / 'data')
    return {**configurator.train_defaults(), 'data_dir': str(tmp_path / 'data'), 'dataset': 'tiny_char',
            'init_from': init_from, **keys}


def test_a_folder_goes_through_the_rules_of_gpt2_names(tmp_path):
    save_hf(tmp_path / 'hf')
    config = train_config(tmp_path, str(tmp_path / 'hf'), block_size=16)
    rules.check_config(config, 1, 'cpu')
    args, crop = rules.model_args(config, None)
    assert (args['n_layer'], args['n_embd'], args['vocab_size'], args['block_size'], crop) == (2, 32, 50257, 16, 16)
    with pytest.raises(ConfigError, match=r"block_size=64 is larger than .*'s 32: use --block_size=32 or less"):
        rules.model_args(dict(config, block_size=64), None)


@pytest.mark.parametrize('make, message', [
    (lambda path: None, "unknown init_from '{path}': neither one of gpt2"),
    (lambda path: (path.mkdir(), (path / 'config.json').write_text(json.dumps({'model_type': 'llama'}))),
     "{path}/config.json has model_type 'llama': init_from takes GPT-2-architecture models only"),
    (lambda path: save_hf(path, weights=False), "{path} has a config.json but no weights"),
    (lambda path: save_hf(path, tie_word_embeddings=False), "sets tie_word_embeddings=False, which this GPT does"),
    (lambda path: save_hf(path, activation_function='relu'), "sets activation_function='relu', which this GPT"),
])
def test_a_folder_that_is_not_a_gpt2_is_one_line(tmp_path, make, message):
    path = tmp_path / 'model'
    make(path)
    config = train_config(tmp_path, str(path))
    with pytest.raises(ConfigError) as e:
        rules.check_config(config, 1, 'cpu')
    assert message.format(path=path) in str(e.value) and '\n' not in str(e.value)
