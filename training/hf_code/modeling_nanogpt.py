"""A model that this project's export_hf.py wrote, in transformers: NanoGPTForCausalLM runs model.py's GPT, the
training code's own (copied beside this file), so it computes what the checkpoint computes. Load it with
AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)."""
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .configuration_nanogpt import NanoGPTConfig
from .model import GPT


def all_position_logits(gpt, idx):
    """GPT.forward's logits (B, T, vocab) at every position of idx, not only the last: the final norm's output at all
    positions goes to lm_head in place of the last position's, so the head and the soft-cap run forward's own code."""
    hidden = []
    with gpt.transformer.ln_f.register_forward_hook(lambda module, args, output: hidden.append(output)), \
            gpt.lm_head.register_forward_pre_hook(lambda module, args: (hidden[0],)):
        logits, _ = gpt(idx)
    return logits


class NanoGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoGPTConfig
    base_model_prefix = 'gpt'
    _tied_weights_keys = {'gpt.lm_head.weight': 'gpt.transformer.wte.weight'}  # with tie_word_embeddings

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config())
        self.post_init()

    def _init_weights(self, module):
        """Nothing: GPT.__init__ initializes every weight (GPT-2's scheme and its options' own), which transformers'
        generic initialization would overwrite."""

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        """CausalLMOutput with the logits of every position and, given labels, the mean cross-entropy of predicting
        labels[:, 1:] (-100: ignored), as transformers' causal LMs compute it. kwargs: transformers' other arguments
        (Trainer's num_items_in_batch reaches the loss); there is no cache."""
        if attention_mask is not None and (attention_mask.diff(dim=-1) > 0).any():
            raise ValueError('NanoGPTForCausalLM attends to every earlier position: pad sequences on the right '
                             '(padding_side="right"), not on the left')
        logits = all_position_logits(self.gpt, input_ids)
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size, **kwargs)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """Each step runs the whole sequence (no cache); past block_size, its last block_size tokens, as GPT.generate
        crops it."""
        context = slice(-self.config.block_size, None)
        return {'input_ids': input_ids[:, context],
                'attention_mask': None if attention_mask is None else attention_mask[:, context]}
