"""gpt2026.py's model (modded-nanogpt's single-GPU record of 24 Jan 2026) in transformers, as this project's
export_hf.py wrote it: GPT2026ForCausalLM runs the training code's own gpt2026.py (copied beside this file), so it
computes what the checkpoint computes. Load it with AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)."""
import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_gpt2026 import GPT2026HFConfig
from .gpt2026 import GPT2026


class ConfiguredGPT2026(GPT2026):
    """GPT2026 whose state beside the weights (the embedding's tie, YaRN's windows) is config.json's: safetensors
    holds tensors, not a module's extra state."""
    get_extra_state = torch.nn.Module.get_extra_state
    set_extra_state = torch.nn.Module.set_extra_state


class GPT2026ForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GPT2026HFConfig
    base_model_prefix = 'gpt'

    def __init__(self, config):
        super().__init__(config)
        self.gpt = ConfiguredGPT2026(config.gpt2026_config())
        self.gpt.embedding_tied, self.gpt.rotary_windows = config.embedding_tied, list(config.rotary_windows)
        self.post_init()

    def _init_weights(self, module):
        """Nothing: GPT2026.__init__ initializes every weight (the record's scheme), which transformers' generic
        initialization would overwrite."""

    def get_input_embeddings(self):
        """What the model looks the tokens up in: the head's weight (lm_head) until the embedding was untied."""
        return self.gpt.lm_head if self.gpt.embedding_tied else self.gpt.transformer.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        """CausalLMOutput with the capped logits of every position (fp32) and, given labels, the mean cross-entropy
        of predicting labels[:, 1:] (-100: ignored), as transformers' causal LMs compute it. attention_mask: 0 at
        padding, on any side: a padded batch runs a row at a time, its tokens alone (a row's first token starts its
        positions, bigrams and smear), padding's logits 0. kwargs: transformers' other arguments (Trainer's
        num_items_in_batch reaches the loss); there is no cache (past_key_values)."""
        if attention_mask is None or attention_mask.all():
            logits = self.gpt.logits(self.gpt.hidden_states(input_ids))
        else:
            dtype = torch.promote_types(self.gpt.lm_head.weight.dtype, torch.float32)  # GPT2026.logits'
            logits = torch.zeros(*input_ids.shape, self.config.vocab_size, dtype=dtype, device=input_ids.device)
            for row, (ids, mask) in enumerate(zip(input_ids, attention_mask.bool())):
                if mask.any():
                    logits[row, mask] = self.gpt.logits(self.gpt.hidden_states(ids[mask][None]))[0]
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """Each step runs the whole sequence and its mask (no cache, whatever use_cache says; no block to crop to)."""
        return {'input_ids': input_ids, 'attention_mask': attention_mask}
