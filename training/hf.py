"""Hugging Face transformers folders and this GPT, both ways: a checkpoint exported as a folder that from_pretrained
loads (weights in safetensors, with its tokenizer), and such a folder, or any GPT-2-architecture one, as init_from.
GPT-2's architecture exports as a GPT2LMHeadModel: the parameters have the same names on both sides, and
model.HF_TRANSPOSED names those stored transposed. Any other (the modern options) exports with its own modeling code:
model.py itself, with the project modules it imports, and the wrappers in training/hf_code/, which transformers runs
with trust_remote_code=True; gpt2026.py's model the same way, with its file and wrappers of its own. transformers is
imported only where a folder is read or written: train.py from scratch never loads it."""
import ast
import json
import os
import re
import shutil
from dataclasses import fields

import torch

from gpt2026 import GPT2026Config
from model import GPT, GPTConfig, HF_TRANSPOSED
from training import runs
from training.errors import ConfigError, first_line
from training.meta import characters
from training.paths import ROOT

# model_args keys that GPT2Config expresses at any value; any other key exports only at GPTConfig's default
EXPRESSIBLE_KEYS = ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size', 'bias', 'dropout', 'tie_weights')
# nn.GELU() is the exact erf GELU, 'gelu' in transformers; OpenAI's GPT-2 uses the tanh approximation 'gelu_new',
# which GPT.from_pretrained has always run with the exact one (the outputs differ by about 1e-3)
ACTIVATIONS = ('gelu', 'gelu_new')
LAYER_NORM_EPS = 1e-5  # model.LayerNorm's
# tiktoken's gpt2 encoding files (tiktoken_ext/openai_public.py), cached by tiktoken on first use: OpenAI's
# encoder.json and vocab.bpe, which are exactly transformers' vocab.json and merges.txt
GPT2_BPE_FILES = {
    'vocab.json': ('https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json',
                   '196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783'),
    'merges.txt': ('https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe',
                   '1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5'),
}
ENDOFTEXT_ID = 50256
HF_WEIGHT_FILES = ('model.safetensors', 'model.safetensors.index.json', 'pytorch_model.bin',
                   'pytorch_model.bin.index.json')
# an export with its own modeling code: model.py from the repository's root, the wrappers from hf_code/, and the
# Auto classes that config.json's auto_map points at them; the wrapper holds the GPT as `gpt`
HF_CODE_DIR = os.path.join(ROOT, 'training', 'hf_code')
MODEL_TYPE = 'nanogpt'
AUTO_MAP = {'AutoConfig': 'configuration_nanogpt.NanoGPTConfig',
            'AutoModelForCausalLM': 'modeling_nanogpt.NanoGPTForCausalLM'}
WEIGHTS_PREFIX = 'gpt.'
# gpt2026.py's model: that file alone (it imports only torch) and its own wrappers
RECORD_2026_MODEL_TYPE = 'gpt2026'
RECORD_2026_AUTO_MAP = {'AutoConfig': 'configuration_gpt2026.GPT2026HFConfig',
                        'AutoModelForCausalLM': 'modeling_gpt2026.GPT2026ForCausalLM'}


# --- export: a checkpoint as a GPT2LMHeadModel folder, or a folder with its own modeling code ---

def inexpressible_keys(model_args):
    """The model_args keys GPT2LMHeadModel has no counterpart for: a key GPT2Config lacks, set to anything but
    GPTConfig's default (an architecture option that is off is plain GPT-2)."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    return [k for k, v in model_args.items()
            if k not in EXPRESSIBLE_KEYS and (k not in defaults or v != defaults[k])]


def has_own_code(model_args):
    """Whether the export of a model of these model_args has its own modeling code: gpt2026.py's, or an architecture
    GPT2LMHeadModel does not have."""
    return runs.model_file(model_args) != runs.GPT_FILE or bool(inexpressible_keys(model_args))


def is_tied(state_dict):
    """Whether the output head is the token embedding (GPT's weight tying); a checkpoint of an untied head holds a
    separate lm_head.weight."""
    return 'lm_head.weight' not in state_dict or torch.equal(state_dict['lm_head.weight'],
                                                             state_dict['transformer.wte.weight'])


def special_tokens(gpt2_tokens):
    """config.json's bos and eos: GPT-2's <|endoftext|>; a character vocabulary has none."""
    special = ENDOFTEXT_ID if gpt2_tokens else None
    return dict(bos_token_id=special, eos_token_id=special)


def hf_config(model_args, tied, gpt2_tokens):
    """The GPT2Config computing what GPT(GPTConfig(**model_args)) computes."""
    from transformers import GPT2Config
    dropout = model_args.get('dropout', 0.0)
    return GPT2Config(vocab_size=model_args['vocab_size'], n_positions=model_args['block_size'],
                      n_embd=model_args['n_embd'], n_layer=model_args['n_layer'], n_head=model_args['n_head'],
                      activation_function='gelu', layer_norm_epsilon=LAYER_NORM_EPS, resid_pdrop=dropout,
                      embd_pdrop=dropout, attn_pdrop=dropout, tie_word_embeddings=tied, **special_tokens(gpt2_tokens))


def hf_model(state_dict, model_args, gpt2_tokens):
    """A GPT2LMHeadModel (fp32) holding the weights of a GPT state dict. Without biases (bias=False) the model gets
    zero biases, which compute exactly the same; bf16 weights become fp32, which holds them exactly."""
    from transformers import GPT2LMHeadModel
    tied = is_tied(state_dict)
    with torch.device('meta'):  # shapes only: the weights are assigned below, never initialized
        model = GPT2LMHeadModel(hf_config(model_args, tied, gpt2_tokens))
    weights = {}
    for name, expected in model.state_dict().items():
        if name in state_dict:
            weight = state_dict[name].float()
            weights[name] = weight.t().contiguous() if name.endswith(HF_TRANSPOSED) else weight
        elif name.endswith('.bias') and not model_args['bias']:
            weights[name] = torch.zeros(expected.shape)
        elif name == 'lm_head.weight' and tied:
            weights[name] = weights['transformer.wte.weight']
    unknown = sorted(set(state_dict) - set(weights) - {k for k in state_dict if k.endswith('.attn.bias')})
    missing = sorted(set(model.state_dict()) - set(weights))
    shapes = [k for k, v in weights.items() if v.shape != model.state_dict()[k].shape]
    if unknown or missing or shapes:  # model_args disagree with the weights: say which names
        problem = (f'weights GPT2LMHeadModel has no place for: {", ".join(unknown[:4])}' if unknown else
                   f'no weights for: {", ".join(missing[:4])}' if missing else
                   f'weights whose shape is not model_args\': {", ".join(shapes[:4])}')
        raise ConfigError(f'the checkpoint does not fit a GPT-2 of its model_args ({problem})')
    model.load_state_dict(weights, strict=True, assign=True)
    if tied:
        model.tie_weights()
    return model.eval()


def gpt_weights(state_dict, model_args):
    """The GPT state dict in fp32 (which holds bf16 weights exactly), checked to be the weights of
    GPT(GPTConfig(**model_args)); ConfigError with one line if not."""
    weights = {name: weight.float() for name, weight in state_dict.items()}
    with torch.device('meta'):  # shapes only
        model = GPT(GPTConfig(**model_args))
    try:
        model.load_state_dict(weights, strict=True, assign=True)
    except RuntimeError as e:
        problem = first_line(' '.join(str(e).split()), limit=240)
        raise ConfigError(f'the checkpoint does not fit a GPT of its model_args ({problem})') from None
    return weights


def model_sources(root, module='model'):
    """{file name: source} of root/module.py and of every module of root it imports, and those import, each import of
    one of them made relative (`from helpers import` becomes `from .helpers import`): transformers runs a
    folder's code as a package, and copies the files that its modules import relatively."""
    sources, pending = {}, [module]
    while pending:
        name = pending.pop()
        with open(os.path.join(root, f'{name}.py'), encoding='utf-8') as f:
            lines = f.read().splitlines(keepends=True)
        for node in ast.walk(ast.parse(''.join(lines))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0
                    and os.path.isfile(os.path.join(root, f'{node.module}.py'))):
                line = node.lineno - 1
                lines[line] = re.sub(rf'\bfrom\s+{node.module}\b', f'from .{node.module}', lines[line], count=1)
                if f'{node.module}.py' not in sources:
                    pending.append(node.module)
        sources[f'{name}.py'] = ''.join(lines)
    return sources


def remote_code_model(weights, config_args, hf_dir, sources, auto_map):
    """Write the modeling code (`sources`, {file name: source}, and the hf_code/ wrappers that auto_map names) to
    hf_dir, and return its model (fp32) of config_args, holding `weights` as `gpt`, loaded as from_pretrained loads
    that code."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    for name, source in sources.items():
        with open(os.path.join(hf_dir, name), 'w', encoding='utf-8') as f:
            f.write(source)
    for reference in auto_map.values():
        name = reference.split('.')[0] + '.py'
        shutil.copyfile(os.path.join(HF_CODE_DIR, name), os.path.join(hf_dir, name))
    config_class, model_class = (get_class_from_dynamic_module(reference, hf_dir) for reference in auto_map.values())
    config = config_class(**config_args, auto_map=auto_map)
    with torch.device('meta'):  # shapes only: the weights are assigned below, never initialized
        model = model_class(config)
    model.gpt.load_state_dict(weights, strict=True, assign=True)
    model.tie_weights()  # assign=True gave lm_head and wte a tensor each
    return model.eval()


def record_2026_export(state_dict, model_args, gpt2_tokens, hf_dir):
    """The GPT2026ForCausalLM (fp32) of a checkpoint of gpt2026.py's model, its code written to hf_dir: the weights
    in safetensors, the model's state beside them (the embedding's tie, YaRN's windows) in config.json."""
    state = state_dict['_extra_state']
    weights = {name: weight.float() for name, weight in state_dict.items() if name != '_extra_state'}
    sources = model_sources(ROOT, runs.RECORD_2026_FILE.removesuffix('.py'))  # the file alone: it imports only torch
    config_args = dict(**{k: v for k, v in model_args.items() if k != 'model_file'}, **state,
                       **special_tokens(gpt2_tokens))
    return remote_code_model(weights, config_args, hf_dir, sources, RECORD_2026_AUTO_MAP)


def export(checkpoint, tokenizer, hf_dir):
    """Write `checkpoint` (load_checkpoint's dict) to hf_dir: config.json, model.safetensors,
    generation_config.json, the tokenizer that write_tokenizer writes for `tokenizer`, and with an architecture
    GPT2LMHeadModel does not have, the modeling code; returns the transformers model. Everything is checked before
    anything is written."""
    state_dict, model_args, gpt2_tokens = checkpoint['model'], checkpoint['model_args'], tokenizer[0] == 'gpt2'
    if runs.model_file(model_args) == runs.RECORD_2026_FILE:
        os.makedirs(hf_dir, exist_ok=True)
        model = record_2026_export(state_dict, model_args, gpt2_tokens, hf_dir)
        # no block size: the tokenizer's longest input is the rows it trained on
        block_size = (checkpoint.get('config') or {}).get('block_size', model.config.long_window)
    elif has_own_code(model_args):
        weights = gpt_weights(state_dict, model_args)
        os.makedirs(hf_dir, exist_ok=True)
        model = remote_code_model(weights, {**model_args, **special_tokens(gpt2_tokens)}, hf_dir,
                                  model_sources(ROOT), AUTO_MAP)
        block_size = model_args['block_size']
    else:
        model = hf_model(state_dict, model_args, gpt2_tokens)
        os.makedirs(hf_dir, exist_ok=True)
        block_size = model_args['block_size']
    model.save_pretrained(hf_dir)  # safetensors; a tied lm_head is stored once, as transformers does
    write_tokenizer(tokenizer, block_size, hf_dir)
    return model


def check_exportable(checkpoint, path):
    """ConfigError with one line if `checkpoint` (from `path`) has model_args that its model file's config (model.py's
    GPTConfig, gpt2026.py's GPT2026Config) does not know."""
    file = runs.model_file(checkpoint['model_args'])
    if file == runs.GPT_FILE:
        known = {f.name for f in fields(GPTConfig)}
    else:  # gpt2026.py's model_args name their file
        known = {f.name for f in fields(GPT2026Config)} | {'model_file'}
    unknown = [f'{k}={v!r}' for k, v in checkpoint['model_args'].items() if k not in known]
    if unknown:
        raise ConfigError(f"{path} has model_args that this {file} does not have: {', '.join(unknown)}; export it "
                          f"with the code that trained it")


def tokenizer_for(model_args, meta_path):
    """What the model's token ids mean: ('chars', meta) for a character vocabulary in meta.pkl, ('gpt2', files) for
    GPT-2's BPE, where files are the bytes of vocab.json and merges.txt from tiktoken's cache (fetched once if not
    there). ConfigError before anything is written if neither can be had (meta.characters' checks)."""
    vocabulary = characters(meta_path, model_args['vocab_size'])
    if vocabulary is not None:
        stoi, itos = vocabulary
        return 'chars', dict(stoi=stoi, itos=itos)
    from tiktoken.load import read_file_cached
    try:
        return 'gpt2', {name: read_file_cached(url, digest) for name, (url, digest) in GPT2_BPE_FILES.items()}
    except Exception as e:  # offline without the cache: the fix is the cache, as for prepare/ and sample.py
        raise ConfigError(f"could not get GPT-2's tokenizer files from tiktoken ({first_line(e)}): run once with "
                          f"network access, or set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached gpt2 "
                          f"files") from None


def write_tokenizer(tokenizer, block_size, hf_dir):
    """The tokenizer that AutoTokenizer.from_pretrained(hf_dir) loads: GPT-2's (vocab.json and merges.txt are
    OpenAI's files), or one that maps each character to its id as meta.pkl does."""
    kind, data = tokenizer
    if kind == 'gpt2':
        from transformers import GPT2TokenizerFast
        for name, content in data.items():
            with open(os.path.join(hf_dir, name), 'wb') as f:
                f.write(content)
        # read back as from_pretrained reads any GPT-2 folder (the constructor's arguments differ between versions)
        hf_tokenizer = GPT2TokenizerFast.from_pretrained(hf_dir, model_max_length=block_size)
    else:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        chars = Tokenizer(models.WordLevel(vocab=dict(data['stoi']), unk_token=None))
        # one token a character; (?m) makes '.' match newlines too in the tokenizers' (Oniguruma) regex
        chars.pre_tokenizer = pre_tokenizers.Split(Regex(r'(?m).'), behavior='isolated')
        chars.decoder = decoders.Fuse()  # decoded characters are joined as they are, without spaces
        hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=chars, model_max_length=block_size,
                                               clean_up_tokenization_spaces=False)
    hf_tokenizer.save_pretrained(hf_dir)


# --- init_from: a local GPT2LMHeadModel folder, or an export with its own modeling code, as a GPT ---

def is_folder(init_from):
    """Whether init_from names a local Hugging Face folder rather than scratch, resume or an OpenAI GPT-2 name."""
    return init_from not in ('scratch', 'resume') and init_from not in GPT.PRETRAINED_ARGS


def pretrained_config(init_from, dropout=0.0):
    """The GPTConfig of init_from's pretrained weights: OpenAI's GPT-2 sizes, or a local folder's config.json,
    without loading the weights. ConfigError with one line for a folder that this GPT cannot run."""
    if init_from in GPT.PRETRAINED_ARGS:
        return GPT.pretrained_config(init_from, dict(dropout=dropout))
    return folder_config(init_from, dropout)[1]


def folder_config(path, dropout):
    """(model_type, GPTConfig) of the folder `path`: a GPT-2 ('gpt2'), or an export with its own modeling code
    ('nanogpt', whose config.json holds GPTConfig's fields); ConfigError with one line for any other."""
    config_path = os.path.join(path, 'config.json')
    if not os.path.isfile(config_path):
        raise ConfigError(f"unknown init_from {path!r}: neither one of {', '.join(GPT.PRETRAINED_ARGS)} nor a "
                          f"folder holding a Hugging Face GPT-2 model or an export_hf.py export (config.json and "
                          f"model.safetensors)")
    try:
        with open(config_path, encoding='utf-8') as f:
            saved = json.load(f)
        model_type = saved.get('model_type')
        from transformers import GPT2Config
        # config.json leaves out the values that are GPT2Config's defaults
        hf = GPT2Config.from_pretrained(path) if model_type == 'gpt2' else None
    except (OSError, ValueError, AttributeError) as e:  # not JSON, not an object, or values GPT2Config refuses
        raise ConfigError(f'cannot read {config_path} ({first_line(e)}): save the model again with '
                          f'save_pretrained') from None
    if model_type == MODEL_TYPE:
        if not os.path.isfile(os.path.join(path, 'model.safetensors')):
            raise ConfigError(f"{path} has a config.json but no weights (model.safetensors): export the model again")
        # a field that config.json lacks is an option newer than the export: off
        return model_type, GPTConfig(**{**{f.name: saved[f.name] for f in fields(GPTConfig) if f.name in saved},
                                        'dropout': dropout})
    if model_type == RECORD_2026_MODEL_TYPE:
        raise ConfigError(f"{path} is an export of gpt2026.py's model, which init_from does not load (the record "
                          f"trains from scratch): sample.py and hellaswag.py read its ckpt.pt with --out_dir")
    if model_type != 'gpt2':
        raise ConfigError(f"{config_path} has model_type {model_type!r}: init_from takes GPT-2-architecture "
                          f"models (model_type 'gpt2', e.g. a GPT-2 finetune or distilgpt2) and export_hf.py's "
                          f"exports ({MODEL_TYPE!r})")
    differences = {
        'activation_function': hf.activation_function not in ACTIVATIONS,
        'n_inner': hf.n_inner not in (None, 4 * hf.n_embd),
        'layer_norm_epsilon': hf.layer_norm_epsilon != LAYER_NORM_EPS,
        'scale_attn_weights': not hf.scale_attn_weights,
        'scale_attn_by_inverse_layer_idx': hf.scale_attn_by_inverse_layer_idx,
        'reorder_and_upcast_attn': hf.reorder_and_upcast_attn,
        'add_cross_attention': hf.add_cross_attention,
        'tie_word_embeddings': not hf.tie_word_embeddings,
    }
    unsupported = [f'{k}={getattr(hf, k)!r}' for k, differs in differences.items() if differs]
    if unsupported:
        raise ConfigError(f"{config_path} sets {', '.join(unsupported)}, which this GPT does not run: init_from "
                          f"takes GPT-2's architecture as OpenAI's checkpoints have it")
    if not any(os.path.isfile(os.path.join(path, name)) for name in HF_WEIGHT_FILES):
        raise ConfigError(f"{path} has a config.json but no weights ({' or '.join(HF_WEIGHT_FILES[::2])}): "
                          f"save the model with save_pretrained")
    return model_type, GPTConfig(n_layer=hf.n_layer, n_head=hf.n_head, n_embd=hf.n_embd, block_size=hf.n_positions,
                                 vocab_size=hf.vocab_size, bias=True, dropout=dropout)


def folder_model(path, dropout=0.0, **options):
    """The GPT with the weights saved in folder `path` (folder_config's kinds); options: GPT's keywords."""
    model_type, config = folder_config(path, dropout)
    try:
        if model_type == MODEL_TYPE:
            from safetensors.torch import load_file
            saved = load_file(os.path.join(path, 'model.safetensors'))
        else:
            from transformers import GPT2LMHeadModel
            model_hf = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32)
    except Exception as e:  # damaged or partial weight files: the fix is to save them again
        raise ConfigError(f'could not load the weights in {path} ({first_line(e)}): save the model again with '
                          f'save_pretrained') from None
    print(f"loading weights from the Hugging Face folder {path}")
    if model_type != MODEL_TYPE:
        return GPT.from_hf_model(model_hf, config, **options)
    # the GPT's own weights, under the wrapper's name for it; a tied head is stored once, as the embedding
    weights = {name.removeprefix(WEIGHTS_PREFIX): weight for name, weight in saved.items()}
    if config.tie_weights and 'transformer.wte.weight' in weights:
        weights['lm_head.weight'] = weights['transformer.wte.weight']
    model = GPT(config, **options)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        raise ConfigError(f"the weights in {path} do not fit its config.json "
                          f"({first_line(' '.join(str(e).split()), limit=240)}): export the model again") from None
    return model
