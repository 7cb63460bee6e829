"""Hugging Face transformers' GPT2LMHeadModel and this GPT, both ways: a checkpoint exported as a folder that
from_pretrained loads (weights in safetensors, with its tokenizer), and a local GPT-2-architecture folder as
init_from. The parameters have the same names on both sides; model.HF_TRANSPOSED names those stored transposed.
transformers is imported only where a folder is read or written: train.py from scratch never loads it."""
import json
import os
from dataclasses import fields

import torch

from model import GPT, GPT2_VOCAB_SIZE, GPTConfig, HF_TRANSPOSED
from training.errors import ConfigError, first_line
from training.meta import load_meta

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


# --- export: a checkpoint as a GPT2LMHeadModel folder ---

def inexpressible_keys(model_args):
    """The model_args keys GPT2LMHeadModel has no counterpart for: a key GPT2Config lacks, set to anything but
    GPTConfig's default (an architecture option that is off is plain GPT-2)."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    return [k for k, v in model_args.items()
            if k not in EXPRESSIBLE_KEYS and (k not in defaults or v != defaults[k])]


def is_tied(state_dict):
    """Whether the output head is the token embedding (GPT's weight tying); a checkpoint of an untied head holds a
    separate lm_head.weight."""
    return 'lm_head.weight' not in state_dict or torch.equal(state_dict['lm_head.weight'],
                                                             state_dict['transformer.wte.weight'])


def hf_config(model_args, tied, gpt2_tokens):
    """The GPT2Config computing what GPT(GPTConfig(**model_args)) computes."""
    from transformers import GPT2Config
    special = ENDOFTEXT_ID if gpt2_tokens else None  # a character vocabulary has no <|endoftext|>
    dropout = model_args.get('dropout', 0.0)
    return GPT2Config(vocab_size=model_args['vocab_size'], n_positions=model_args['block_size'],
                      n_embd=model_args['n_embd'], n_layer=model_args['n_layer'], n_head=model_args['n_head'],
                      activation_function='gelu', layer_norm_epsilon=LAYER_NORM_EPS, resid_pdrop=dropout,
                      embd_pdrop=dropout, attn_pdrop=dropout, tie_word_embeddings=tied, bos_token_id=special,
                      eos_token_id=special)


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


def export(checkpoint, tokenizer, hf_dir):
    """Write `checkpoint` (load_checkpoint's dict) to hf_dir as a GPT2LMHeadModel folder: config.json,
    model.safetensors, generation_config.json, and the tokenizer that write_tokenizer writes for `tokenizer`."""
    model = hf_model(checkpoint['model'], checkpoint['model_args'], tokenizer[0] == 'gpt2')
    os.makedirs(hf_dir, exist_ok=True)
    model.save_pretrained(hf_dir)  # safetensors; a tied lm_head is stored once, as transformers does
    write_tokenizer(tokenizer, checkpoint['model_args']['block_size'], hf_dir)
    return model


def check_exportable(checkpoint, path):
    """ConfigError with one line if `checkpoint` (from `path`) cannot be expressed as a GPT2LMHeadModel."""
    keys = inexpressible_keys(checkpoint['model_args'])
    if keys:
        settings = ', '.join(f'{k}={checkpoint["model_args"][k]!r}' for k in keys)
        raise ConfigError(f'{path} cannot be exported as a GPT2LMHeadModel: it has no counterpart for {settings}')


def tokenizer_for(model_args, meta_path):
    """What the model's token ids mean: ('chars', meta) for a character vocabulary in meta.pkl, ('gpt2', files) for
    GPT-2's BPE, where files are the bytes of vocab.json and merges.txt from tiktoken's cache (fetched once if not
    there). ConfigError before anything is written if neither can be had."""
    if meta_path is not None and os.path.exists(meta_path):
        meta = load_meta(meta_path)
        if 'stoi' not in meta or 'itos' not in meta:
            raise ConfigError(f'{meta_path} has no stoi/itos vocabulary: the export needs to know what the token '
                              f'ids mean; prepare the dataset again')
        return 'chars', meta
    if model_args['vocab_size'] < GPT2_VOCAB_SIZE:
        raise ConfigError(f"the model's vocab_size is {model_args['vocab_size']}, too small for GPT-2's tokens, and "
                          f"its dataset's meta.pkl ({meta_path or 'none recorded'}) is not there: run from the "
                          f"directory it was trained in, or prepare that dataset again")
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


# --- init_from: a local GPT2LMHeadModel folder as a GPT ---

def is_folder(init_from):
    """Whether init_from names a local Hugging Face folder rather than scratch, resume or an OpenAI GPT-2 name."""
    return init_from not in ('scratch', 'resume') and init_from not in GPT.PRETRAINED_ARGS


def pretrained_config(init_from, dropout=0.0):
    """The GPTConfig of init_from's pretrained weights: OpenAI's GPT-2 sizes, or a local folder's config.json,
    without loading the weights. ConfigError with one line for a folder that is not a GPT-2 this GPT can run."""
    if init_from in GPT.PRETRAINED_ARGS:
        return GPT.pretrained_config(init_from, dict(dropout=dropout))
    config_path = os.path.join(init_from, 'config.json')
    if not os.path.isfile(config_path):
        raise ConfigError(f"unknown init_from {init_from!r}: neither one of {', '.join(GPT.PRETRAINED_ARGS)} nor a "
                          f"folder holding a Hugging Face GPT-2 model (config.json and model.safetensors)")
    try:
        with open(config_path, encoding='utf-8') as f:
            model_type = json.load(f).get('model_type')
        from transformers import GPT2Config
        # config.json leaves out the values that are GPT2Config's defaults
        hf = GPT2Config.from_pretrained(init_from) if model_type == 'gpt2' else None
    except (OSError, ValueError, AttributeError) as e:  # not JSON, not an object, or values GPT2Config refuses
        raise ConfigError(f'cannot read {config_path} ({first_line(e)}): save the model again with '
                          f'save_pretrained') from None
    if model_type != 'gpt2':
        raise ConfigError(f"{config_path} has model_type {model_type!r}: init_from takes GPT-2-architecture "
                          f"models only (model_type 'gpt2', e.g. a GPT-2 finetune or distilgpt2)")
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
    if not any(os.path.isfile(os.path.join(init_from, name)) for name in HF_WEIGHT_FILES):
        raise ConfigError(f"{init_from} has a config.json but no weights ({' or '.join(HF_WEIGHT_FILES[::2])}): "
                          f"save the model with save_pretrained")
    return GPTConfig(n_layer=hf.n_layer, n_head=hf.n_head, n_embd=hf.n_embd, block_size=hf.n_positions,
                     vocab_size=hf.vocab_size, bias=True, dropout=dropout)


def folder_model(path, dropout=0.0, **options):
    """The GPT (with GPT's keyword `options`) with the weights of the GPT2LMHeadModel saved in folder `path`."""
    config = pretrained_config(path, dropout)
    from transformers import GPT2LMHeadModel
    try:
        model_hf = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32)
    except Exception as e:  # damaged or partial weight files: the fix is to save them again
        raise ConfigError(f'could not load the weights in {path} ({first_line(e)}): save the model again with '
                          f'save_pretrained') from None
    print(f"loading weights from the Hugging Face folder {path}")
    return GPT.from_hf_model(model_hf, config, **options)
