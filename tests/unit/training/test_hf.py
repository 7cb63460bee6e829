"""training/hf.py: a checkpoint exported to a transformers folder computes the same logits and greedy tokens as the
GPT it came from (tied or not, with or without biases, bf16 weights, wrapped names), a GPT2LMHeadModel for GPT-2's
architecture and its own modeling code (model.py) for any other, the gpt2 tokenizer is tiktoken's, and a local GPT-2
folder or an export is an init_from as the gpt2* names are."""
import json

import pytest
import tiktoken
import torch

from training import configurator
from helpers import HF_ARGS as ARGS
from helpers import (MODERN_ARCH_ARGS, ROOT, TEXT, assert_same_model, gpt2_cached, trained_like_gpt,
                     write_char_dataset, write_checkpoint)
from model import GPTConfig
from training import hf, rules
from training.checkpoint import load_checkpoint, load_model, pretrained_model
from training.errors import ConfigError
from training.meta import load_meta
from training.step import build_model


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
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
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


def modern(**overrides):
    """GPTConfig's arguments of MODERN_ARCH_ARGS (every modern option on: the speedrun preset's architecture), as
    train.py builds them, beyond ARGS' shape; overrides: keys to change."""
    config = configurator.load_config(configurator.train_keys(), MODERN_ARCH_ARGS)
    args = rules.model_args(config, ARGS['vocab_size'])[0]
    return {**{k: v for k, v in args.items() if k not in ARGS}, **overrides}


def load_export(hf_dir):
    """AutoModelForCausalLM's model of an export with its own modeling code. transformers imported here, not at
    collection: seconds to import."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(hf_dir, trust_remote_code=True)


@pytest.mark.parametrize('options, dtype, prefix', [
    (modern(), torch.bfloat16, 'module.'),  # untied, DDP's names, bf16 weights
    (modern(tie_weights=True, bias=False), torch.float32, '_orig_mod.'),
    ({'pos_emb': 'rope'}, torch.float32, ''),  # one option GPT-2 lacks is enough
], ids=['modern', 'modern-tied', 'rope'])
def test_any_other_architecture_exports_with_its_own_modeling_code(tmp_path, options, dtype, prefix):
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
    model = trained_like_gpt(0, **options)
    write_checkpoint(tmp_path / 'out', model, prefix, dtype)
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    model.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})  # what was saved
    theirs = load_export(tmp_path / 'hf')
    assert type(theirs).__name__ == 'NanoGPTForCausalLM'
    assert theirs.config.tie_word_embeddings == model.config.tie_weights
    assert_same_model(model, theirs)
    saved = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    assert saved['auto_map'] == hf.AUTO_MAP and saved['model_type'] == 'nanogpt' and saved['pos_emb'] == 'rope'
    # the folder's code is the repository's model.py (which imports no module of the repository; one that did would
    # be copied with it, its import made relative: transformers copies what those name)
    copied = {path.stem for path in (tmp_path / 'hf').glob('*.py')} - {'modeling_nanogpt', 'configuration_nanogpt'}
    assert copied == {'model'}
    for name in copied:
        text = (tmp_path / 'hf' / f'{name}.py').read_text()
        for module in copied:
            text = text.replace(f'from .{module} import', f'from {module} import')
        assert text == (ROOT / f'{name}.py').read_text(), name
    from transformers.dynamic_module_utils import get_imports
    for path in (tmp_path / 'hf').glob('*.py'):
        assert not [name for name in get_imports(path) if (ROOT / f'{name}.py').exists()], path
    back = pretrained_model(str(tmp_path / 'hf'))
    assert back.config == model.config
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())


def test_an_export_computes_the_loss_generates_past_its_block_and_tokenizes(tmp_path):
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
    model = trained_like_gpt(0, **modern())
    write_checkpoint(tmp_path / 'out', model)
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    theirs = load_export(tmp_path / 'hf')
    assert theirs.get_input_embeddings() is theirs.gpt.transformer.wte
    assert theirs.get_output_embeddings() is theirs.gpt.lm_head
    torch.manual_seed(1)
    idx = torch.randint(0, ARGS['vocab_size'], (2, 12))
    labels = idx.clone()
    labels[:, -3:] = -100  # transformers' ignored label
    with torch.no_grad():
        targets = torch.where(labels[:, 1:] == -100, -1, labels[:, 1:])
        _, loss = model(idx[:, :-1], targets=targets)
        torch.testing.assert_close(theirs(idx, labels=labels).loss, loss, atol=1e-5, rtol=0)
        # right padding leaves the positions before it as they are (left padding: below)
        mask = torch.ones_like(idx)
        mask[:, -2:] = 0
        torch.testing.assert_close(theirs(idx, attention_mask=mask).logits[:, :-2], theirs(idx).logits[:, :-2],
                                   atol=1e-5, rtol=0)
        # past block_size, generation runs on the last block_size tokens, as GPT.generate does
        prompt = idx[:1, :6]
        greedy = theirs.generate(prompt, max_new_tokens=20, do_sample=False)
        assert greedy.shape[1] == 26 > ARGS['block_size'] and torch.equal(greedy, model.generate(prompt, 20, top_k=1))
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    stoi = load_meta(str(data / 'meta.pkl'))['stoi']
    assert tokenizer.encode(TEXT[:40]) == [stoi[c] for c in TEXT[:40]]


PRESET = ROOT / 'config' / 'speedrun_gpt2_12gb.py'


def preset_args():
    """GPTConfig's arguments of the 12 GB speedrun preset (the record's architecture) as train.py builds them, scaled
    down: its depth and heads, 48 wide, on rows of 32 characters whose newline (id 0) starts each document, a window
    of 8 in blocks of 4; three value-embedding tables (the 4 Jan 2025 record's) where the preset has none."""
    config = configurator.load_config(configurator.train_keys(), [str(PRESET)])
    config.update(n_embd=48, block_size=32, attn_window=8, attn_window_block=min(config['attn_window_block'], 4),
                  doc_token=0, value_embeds=config['value_embeds'] or 3, hellaswag=False)
    return rules.model_args(config, ARGS['vocab_size'])[0]


def test_a_padded_batch_generates_each_prompts_own_tokens(tmp_path):
    """transformers' generate on a batch of prompts of different lengths, left-padded with the newline (id 0) and no
    attention_mask (generate makes one from pad_token_id, which also masks the prompts' own newlines, as for
    GPT2LMHeadModel), or with the tokenizer's mask: each row gets the tokens its prompt gets alone, with or without
    use_cache, past block_size too; with the mask, those are GPT.generate's. The logits of a padded batch's tokens,
    left or right, are those of each row alone, whatever the padding's ids."""
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
    model = trained_like_gpt(6, **preset_args())  # a seed whose greedy tokens include newlines: documents start there
    write_checkpoint(tmp_path / 'out', model)
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    theirs = load_export(tmp_path / 'hf')
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / 'hf', trust_remote_code=True)
    tokenizer.pad_token = '\n'
    prompts = ['First Citizen:\nBefore we', 'All:\nSpeak', 'You are', 'R']
    alone = [tokenizer(prompt, return_tensors='pt').input_ids for prompt in prompts]
    new_tokens = 12  # the longest prompt's 24 tokens and 12 new ones: past block_size (32)
    with torch.no_grad():
        for side in ('left', 'right'):
            tokenizer.padding_side = side
            batch = tokenizer(prompts, return_tensors='pt', padding=True)
            logits = theirs(**batch).logits
            # padding's ids are never seen, even one past the vocabulary (a tokenizer's added <|pad|>)
            past_vocabulary = batch.input_ids.masked_fill(batch.attention_mask == 0, ARGS['vocab_size'])
            assert torch.equal(theirs(past_vocabulary, attention_mask=batch.attention_mask).logits, logits)
            for row, mask, ids in zip(logits, batch.attention_mask, alone):
                torch.testing.assert_close(row[mask.bool()], theirs(ids).logits[0], atol=1e-5, rtol=0)
        tokenizer.padding_side = 'left'
        batch = tokenizer(prompts, return_tensors='pt', padding=True)
        assert batch.attention_mask[-1].tolist() == [0] * 23 + [1]
        for use_cache in (True, False):
            greedy = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, use_cache=use_cache)
            by_pad = theirs.generate(batch.input_ids, **greedy)[:, -new_tokens:]
            masked = theirs.generate(**batch, **greedy)[:, -new_tokens:]
            for i, ids in enumerate(alone):
                assert torch.equal(by_pad[i], theirs.generate(ids, **greedy)[0, -new_tokens:]), (use_cache, i)
                assert torch.equal(masked[i], model.generate(ids, new_tokens, top_k=1)[0, -new_tokens:]), (use_cache, i)
    assert len({tuple(row.tolist()) for row in masked}) == len(prompts) and 0 in masked  # not one repeated token


def test_model_sources_make_imports_of_project_modules_relative(tmp_path):
    """model.py's imports of the repository's modules (the chunked loss's, split out of it) go with it, relative."""
    (tmp_path / 'model.py').write_text('import math\nfrom torch import nn\nfrom loss import ce  # the loss\n'
                                       'from  loss import (\n    ce2)\n')
    (tmp_path / 'loss.py').write_text('from kernels import k\nfrom math import tau\n')
    (tmp_path / 'kernels.py').write_text('import torch\n')
    (tmp_path / 'train.py').write_text('from model import GPT\n')  # not imported by model.py: not copied
    sources = hf.model_sources(tmp_path)
    assert sources == {
        'model.py': ('import math\nfrom torch import nn\nfrom .loss import ce  # the loss\n'
                     'from .loss import (\n    ce2)\n'),
        'loss.py': 'from .kernels import k\nfrom math import tau\n',
        'kernels.py': 'import torch\n',
    }
    for name, source in sources.items():
        (tmp_path / 'folder').mkdir(exist_ok=True)
        (tmp_path / 'folder' / name).write_text(source)
    from transformers.dynamic_module_utils import get_relative_import_files  # what transformers copies with it
    assert sorted(get_relative_import_files(tmp_path / 'folder' / 'model.py')) == [
        str(tmp_path / 'folder' / 'kernels.py'), str(tmp_path / 'folder' / 'loss.py')]


def test_what_cannot_be_exported_is_one_line_before_writing(tmp_path):
    checkpoint = {'model': trained_like_gpt(0).state_dict(), 'model_args': {**ARGS, 'rotary': True, 'n_expert': 8}}
    with pytest.raises(ConfigError) as e:
        hf.check_exportable(checkpoint, 'ckpt.pt')
    assert str(e.value) == ("ckpt.pt has model_args that this model.py does not have: rotary=True, n_expert=8; export "
                            "it with the code that trained it")
    hf.check_exportable({'model_args': {**ARGS, **modern()}}, 'ckpt.pt')  # every option GPTConfig has exports
    # model_args that disagree with the weights: one line naming them, and no folder
    weights = trained_like_gpt(0, **modern()).state_dict()
    checkpoint = {'model': weights, 'model_args': {**ARGS, **modern(), 'n_layer': 3}}
    with pytest.raises(ConfigError, match=r'^the checkpoint does not fit a GPT of its model_args \(.*Missing.*h\.2\.'):
        hf.export(checkpoint, ('chars', None), str(tmp_path / 'hf'))
    assert not (tmp_path / 'hf').exists()


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
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
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


def test_an_export_goes_through_the_rules_with_its_options(tmp_path):
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0, **modern()))
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    config = train_config(tmp_path, str(tmp_path / 'hf'), block_size=8, dropout=0.1)
    rules.check_config(config, 1, 'cpu')
    args, crop = rules.model_args(config, None)
    assert args == {**ARGS, **modern(), 'block_size': 8, 'dropout': 0.1} and crop == 8
    # train.py's model: the export's weights with this run's dropout, cropped to the run's block_size
    model = build_model(config, args)
    assert model.config == GPTConfig(**args) and not model.config.tie_weights


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
     "{path}/config.json has model_type 'llama': init_from takes GPT-2-architecture models (model_type 'gpt2', "
     "e.g. a GPT-2 finetune or distilgpt2) and export_hf.py's exports ('nanogpt')"),
    (lambda path: (path.mkdir(), (path / 'config.json').write_text(json.dumps({'model_type': 'nanogpt'}))),
     "{path} has a config.json but no weights (model.safetensors): export the model again"),
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


def test_an_export_whose_weights_do_not_fit_its_config_is_one_line(tmp_path):
    write_checkpoint(tmp_path / 'out', trained_like_gpt(0, **modern()))
    data = write_char_dataset(tmp_path / 'data', vocab_size=ARGS['vocab_size'])
    export(tmp_path / 'out', tmp_path / 'hf', str(data / 'meta.pkl'))
    saved = json.loads((tmp_path / 'hf' / 'config.json').read_text())
    (tmp_path / 'hf' / 'config.json').write_text(json.dumps({**saved, 'value_embeds': 2}))
    with pytest.raises(ConfigError, match=rf"^the weights in {tmp_path / 'hf'} do not fit its config.json \(.*"
                                          rf"value_embeds\.1\.weight.*\): export the model again$"):
        load_model(str(tmp_path / 'hf'), 'unused', 'cpu')
