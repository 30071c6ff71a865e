"""Convert resemblyzer's pretrained GE2E speaker encoder to `myxtts/evaluation/ge2e_weights.npz`, without torch.

Where the weights come from: `resemblyzer/pretrained.pt` in the wheel `Resemblyzer-0.1.4-py3-none-any.whl`
(PyPI, Apache-2.0, https://github.com/resemble-ai/Resemblyzer): a 3-layer LSTM (40 -> 256) and a
Linear 256 -> 256 + ReLU, trained with the GE2E loss (Wan et al., 2018). `myxtts/evaluation/speaker.py`
runs them in numpy. The committed file was made with

    pip download --no-deps Resemblyzer==0.1.4 -d /tmp/rz
    .venv/bin/python utilities/convert_ge2e_weights.py --source /tmp/rz/Resemblyzer-0.1.4-py3-none-any.whl

(`--source` also takes a `pretrained.pt` file; without it, an installed resemblyzer's is used, found
without importing the package, which would import torch.)

`pretrained.pt` is a torch checkpoint in torch's legacy (pre-1.6, not zip) format: five pickles in a
row (magic number, protocol version, system info, the object, the list of storage keys) and then
each storage's raw bytes, an int64 element count followed by the elements. The object's pickle
refers to storages by persistent id and rebuilds tensors with `torch._utils._rebuild_tensor_v2`; a
small `pickle.Unpickler` answers both with numpy, so torch is never imported. The zip format of
newer checkpoints (`data.pkl` plus one file per storage) is read the same way.

Only the model weights are kept (the checkpoint's GE2E similarity scale and its optimizer state are
dropped). The npz holds, per LSTM layer `l`, in torch's gate order (input, forget, cell, output):

    lstm{l}_w_ih   [inputs, 1024]  weight_ih_l{l} transposed, so that x @ w_ih gives the four gates
    lstm{l}_w_hh   [256, 1024]     weight_hh_l{l} transposed
    lstm{l}_bias   [1024]          bias_ih_l{l} + bias_hh_l{l}
    linear_w       [256, 256]      linear.weight transposed
    linear_b       [256]

plus `source` (a string naming the checkpoint and its sha256). Float32 throughout: 1.42 M
parameters, 5.7 MB.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import io
import pickle
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "myxtts" / "evaluation" / "ge2e_weights.npz"
WHEEL_MEMBER = "resemblyzer/pretrained.pt"
NUM_LAYERS = 3
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    """Stands for `torch.FloatStorage` and friends in the pickle: only its dtype matters."""

    def __init__(self, name: str):
        self.dtype = np.dtype(_STORAGE_DTYPES[name])


class _Tensor:
    """A tensor to be filled in once its storage's bytes are read (they follow the pickle)."""

    def __init__(self, storage_key: str, offset: int, size: tuple, stride: tuple):
        self.storage_key, self.offset, self.size, self.stride = storage_key, offset, tuple(size), tuple(stride)


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    key, _ = storage
    return _Tensor(key, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data


class _TorchFreeUnpickler(pickle.Unpickler):
    """Unpickles a torch checkpoint's object with numpy stand-ins for torch's classes."""

    def __init__(self, file):
        super().__init__(file)
        self.storage_dtypes: dict[str, np.dtype] = {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module.startswith("torch"):
            raise pickle.UnpicklingError(
                f"the checkpoint uses {module}.{name}, which this torch-free reader does not know; "
                f"add it to _TorchFreeUnpickler.find_class in {Path(__file__).name}"
            )
        return super().find_class(module, name)

    def persistent_load(self, saved_id):
        # legacy: ('storage', type, key, location, numel, view_metadata); zip: ('storage', type, key, location, numel)
        if saved_id[0] != "storage":
            raise pickle.UnpicklingError(f"unexpected persistent id {saved_id[:2]!r} in the checkpoint")
        storage_type, key = saved_id[1], str(saved_id[2])
        if len(saved_id) > 5 and saved_id[5] is not None:
            raise pickle.UnpicklingError("storage views (legacy view_metadata) are not supported")
        self.storage_dtypes[key] = storage_type.dtype
        return (key, storage_type.dtype)


def _materialize(obj, storages: dict[str, np.ndarray]):
    """`obj` with every `_Tensor` replaced by its numpy array (a copy, not a view of the storage)."""
    if isinstance(obj, _Tensor):
        storage = storages[obj.storage_key]
        strides = tuple(step * storage.itemsize for step in obj.stride)
        view = np.lib.stride_tricks.as_strided(storage[obj.offset :], shape=obj.size, strides=strides)
        return np.array(view)
    if isinstance(obj, dict):
        return type(obj)((key, _materialize(value, storages)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_materialize(value, storages) for value in obj)
    return obj


def _load_legacy(data: bytes):
    stream = io.BytesIO(data)
    if pickle.load(stream) != LEGACY_MAGIC:
        raise ValueError("not a torch checkpoint: wrong magic number")
    pickle.load(stream)  # protocol version
    sys_info = pickle.load(stream)
    if not sys_info.get("little_endian", True):
        raise ValueError("big-endian torch checkpoints are not supported")
    unpickler = _TorchFreeUnpickler(stream)
    obj = unpickler.load()
    storage_keys = pickle.load(stream)
    storages = {}
    for key in storage_keys:
        (numel,) = struct.unpack("<q", stream.read(8))
        dtype = unpickler.storage_dtypes[key]
        storages[key] = np.frombuffer(stream.read(numel * dtype.itemsize), dtype=dtype.newbyteorder("<"))
    return _materialize(obj, storages)


def _load_zip(data: bytes):
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        pickle_name = next(name for name in archive.namelist() if name.endswith("/data.pkl"))
        prefix = pickle_name[: -len("data.pkl")]
        unpickler = _TorchFreeUnpickler(io.BytesIO(archive.read(pickle_name)))
        obj = unpickler.load()
        storages = {
            key: np.frombuffer(archive.read(f"{prefix}data/{key}"), dtype=dtype.newbyteorder("<"))
            for key, dtype in unpickler.storage_dtypes.items()
        }
    return _materialize(obj, storages)


def load_torch_checkpoint(data: bytes):
    """The object saved by `torch.save` in `data` (legacy or zip format), tensors as numpy arrays."""
    return _load_zip(data) if data[:2] == b"PK" else _load_legacy(data)


def read_checkpoint_bytes(source: Path | None) -> tuple[bytes, str]:
    """(bytes of pretrained.pt, a description of where they came from)."""
    if source is None:
        spec = importlib.util.find_spec("resemblyzer")  # finds the package without importing it (and torch)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("resemblyzer is not installed here: pass --source <Resemblyzer-0.1.4-py3-none-any.whl>")
        source = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            return wheel.read(WHEEL_MEMBER), f"{source.name}:{WHEEL_MEMBER}"
    return source.read_bytes(), source.name


def encoder_weights(model_state: dict) -> dict[str, np.ndarray]:
    """The npz arrays (layout in the module docstring) from resemblyzer's `model_state`."""
    weights = {}
    for layer in range(NUM_LAYERS):
        weights[f"lstm{layer}_w_ih"] = model_state[f"lstm.weight_ih_l{layer}"].T.astype(np.float32)
        weights[f"lstm{layer}_w_hh"] = model_state[f"lstm.weight_hh_l{layer}"].T.astype(np.float32)
        bias = model_state[f"lstm.bias_ih_l{layer}"] + model_state[f"lstm.bias_hh_l{layer}"]
        weights[f"lstm{layer}_bias"] = bias.astype(np.float32)
    weights["linear_w"] = model_state["linear.weight"].T.astype(np.float32)
    weights["linear_b"] = model_state["linear.bias"].astype(np.float32)
    return weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, help="Resemblyzer wheel or pretrained.pt (default: installed resemblyzer)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    data, origin = read_checkpoint_bytes(args.source)
    checkpoint = load_torch_checkpoint(data)
    weights = encoder_weights(checkpoint["model_state"])
    digest = hashlib.sha256(data).hexdigest()
    source = f"{origin} (resemblyzer 0.1.4, Apache-2.0), sha256 {digest}, training step {checkpoint.get('step')}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, source=np.array(source), **weights)
    parameters = sum(array.size for array in weights.values())
    print(f"wrote {args.out}: {parameters:,} parameters, {args.out.stat().st_size / 1e6:.2f} MB, from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
