"""The training loop: optimizers, the compiled train step, checkpoints, callbacks and `train()`."""
