"""The configuration of a model that this project's export_hf.py wrote: GPTConfig's fields (model.py, beside this
file in the folder), which config.json holds and AutoConfig.from_pretrained(folder, trust_remote_code=True) reads."""
from dataclasses import fields

from transformers import PretrainedConfig

from .model import GPTConfig


class NanoGPTConfig(PretrainedConfig):
    model_type = 'nanogpt'
    # transformers' names for the sizes, which its tools read (lm-evaluation-harness: max_position_embeddings)
    attribute_map = {'max_position_embeddings': 'block_size', 'hidden_size': 'n_embd', 'num_hidden_layers': 'n_layer',
                     'num_attention_heads': 'n_head'}

    def __init__(self, **kwargs):
        for field in fields(GPTConfig):  # a field config.json lacks (an option newer than the export) is off
            setattr(self, field.name, kwargs.pop(field.name, field.default))
        kwargs['tie_word_embeddings'] = self.tie_weights  # transformers' name for it: save and load tie the head
        super().__init__(**kwargs)

    def gpt_config(self):
        """The GPTConfig of the model."""
        return GPTConfig(**{field.name: getattr(self, field.name) for field in fields(GPTConfig)})
