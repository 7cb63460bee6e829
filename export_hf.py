"""
Export a checkpoint to a Hugging Face transformers folder (docs/export.md):
$ python export_hf.py --out_dir=out-shakespeare-char --hf_dir=hf-shakespeare-char

The folder loads with transformers.AutoModelForCausalLM.from_pretrained(hf_dir) (fp32 weights in model.safetensors)
and AutoTokenizer.from_pretrained(hf_dir): GPT-2's BPE, or the dataset's characters (meta.pkl), so
lm-evaluation-harness and other transformers tools run it. GPT-2's architecture becomes a GPT2LMHeadModel; any other
(the modern options) a folder with its own modeling code, this repository's model.py among it, which loads with
trust_remote_code=True; gpt2026.py's model such a folder with gpt2026.py. The way back (model.py's):
train.py --init_from=hf_dir.
"""
import sys

from training import configurator
from training.checkpoint import checkpoint_path, load_checkpoint
from training.errors import fail, install_handler
from training.hf import check_exportable, export, has_own_code, tokenizer_for
from training.meta import trained_meta_path
from training.paths import check_writable_dir

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)

# -----------------------------------------------------------------------------
defaults = dict(
    out_dir='out', # the checkpoint to export: out_dir/ckpt.pt, as sample.py reads it
    hf_dir='', # the folder to write; '' = out_dir/hf
    meta_path='', # the dataset's meta.pkl; '' = the one the checkpoint was trained with (data_dir/dataset/meta.pkl)
)
try:
    import transformers # noqa: F401  the folder is written by transformers itself
except ImportError:
    fail('export_hf.py writes the folder with Hugging Face transformers: pip install transformers')
config = configurator.load_config(configurator.read_keys(__file__, 'defaults'), sys.argv[1:])
hf_dir = config['hf_dir'] or f"{config['out_dir']}/hf"
check_writable_dir(hf_dir, key='hf_dir')
# everything is read and checked before anything is written
checkpoint = load_checkpoint(config['out_dir'], 'cpu')
check_exportable(checkpoint, checkpoint_path(config['out_dir']))
meta_path = config['meta_path'] or trained_meta_path(checkpoint.get('config') or {})
tokenizer = tokenizer_for(checkpoint['model_args'], meta_path)
export(checkpoint, tokenizer, hf_dir)
# -----------------------------------------------------------------------------

if tokenizer[0] == 'chars':
    print(f"the tokenizer maps each character to its id as {meta_path} does: GPT-2's BPE cannot express it")
# a folder with its own modeling code runs it only when trusted (AutoTokenizer reads config.json too)
options = ', trust_remote_code=True' if has_own_code(checkpoint['model_args']) else ''
print(f"exported {checkpoint_path(config['out_dir'])} to {hf_dir}: load it with "
      f"transformers.AutoModelForCausalLM.from_pretrained({hf_dir!r}{options}) and "
      f"AutoTokenizer.from_pretrained({hf_dir!r}{options})")
