"""train.py's optimizers built as on a CUDA GPU (training.optim.build_optimizer with device_type 'cuda': torch's
fused AdamW for configure_optimizers' AdamW and Muon's AdamW groups), stepped on the CPU, where torch's fused AdamW
runs and checks its own contract (its params' and gradients' dtypes and devices)."""
from training import optim, step

step.build_optimizer = lambda model, config, device_type: optim.build_optimizer(model, config, 'cuda')
