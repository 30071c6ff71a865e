"""MyXTTS: a TensorFlow/Keras training pipeline for XTTS-style voice-cloning text-to-speech.

Importing the package is cheap and has no side effects: TensorFlow is imported only by the
modules that need it, so `python -m myxtts.hardware` works on a machine without TensorFlow.
"""

__version__ = "0.1.0"
