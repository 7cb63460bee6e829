"""The configuration of gpt2026.py's model as this project's export_hf.py wrote it: GPT2026Config's fields
(gpt2026.py, beside this file in the folder) and the model's state beside its weights (the embedding's tie, YaRN's
windows), which config.json holds and AutoConfig.from_pretrained(folder, trust_remote_code=True) reads."""
from dataclasses import fields

from transformers import PretrainedConfig

from .gpt2026 import GPT2026Config


class GPT2026HFConfig(PretrainedConfig):
    model_type = 'gpt2026'
    attribute_map = {'hidden_size': 'n_embd', 'num_attention_heads': 'n_head'}  # transformers' names for the sizes

    def __init__(self, embedding_tied=True, rotary_windows=(), **kwargs):
        for field in fields(GPT2026Config):
            setattr(self, field.name, kwargs.pop(field.name, field.default))
        self.embedding_tied, self.rotary_windows = embedding_tied, list(rotary_windows)
        kwargs['num_hidden_layers'] = len(self.layers)  # transformers' generate sizes its (unused) cache by it
        kwargs['tie_word_embeddings'] = False  # two tensors, wte and lm_head: while tied, the model reads the head's
        super().__init__(**kwargs)

    def gpt2026_config(self):
        """The GPT2026Config of the model (config.json holds its tuples as lists)."""
        args = {field.name: getattr(self, field.name) for field in fields(GPT2026Config)}
        args.update(layers=tuple(tuple(layer) for layer in args['layers']), skip=tuple(args['skip']))
        return GPT2026Config(**args)
