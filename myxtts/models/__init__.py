"""Batches -> predictions and losses: the XTTS network, its sizes, losses and synthesis.

Submodules are imported where they are used (`from myxtts.models.xtts import XTTS`), so importing
this package loads no TensorFlow.
"""
