"""The one typed configuration tree: data, model, training and hardware.

Defaults live in the dataclasses below and nowhere else; `configs/config.yaml` mirrors them with a
comment on every key (a test keeps the two equal). A run is configured in layers, later wins:

    dataclass defaults  <  YAML file  <  `--set key=value` overrides

and then the optimization level (`basic`, `enhanced`, `experimental`) fills in every key that is
still `null` ("let the level decide"). So a key written explicitly in the YAML or with `--set` always
beats the preset, and the preset beats nothing but an unset key.

Unknown keys are errors that name the file, the key and the closest valid key; wrong types and
impossible combinations raise `ConfigError` saying what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

OptimizationLevel = Literal["basic", "enhanced", "experimental"]
Precision = Literal["auto", "bf16", "fp16", "fp32"]


class ConfigError(ValueError):
    """A configuration problem, phrased as what to change."""


@dataclass
class DataConfig:
    train_data: str = ""
    val_data: str = ""
    unseen_voices_data: str = ""
    val_fraction: float = 0.05
    text_frontend: Literal["phonemes", "characters"] = "phonemes"
    language: str = "en-us"
    sample_rate: int = 22050
    n_fft: int = 1024
    win_length: int = 1024
    hop_length: int = 256
    n_mels: int = 80
    fmin: float = 0.0
    fmax: float = 8000.0
    mel_scale: Literal["slaney", "htk"] = "slaney"
    power: float = 1.0
    log_floor: float = 1e-5
    peak_normalize: float = 0.95
    trim_silence_db: float = 60.0
    min_duration_s: float = 0.5
    max_duration_s: float = 12.0
    reference_duration_s: float = 3.0
    bucket_boundaries_s: list[float] = field(default_factory=lambda: [2.0, 4.0, 6.0, 8.0, 10.0, 12.0])
    max_chars_per_second: float = 25.0
    batch_size: int = 0
    num_workers: int = 0
    prefetch_buffer_size: int = 0
    prefetch_to_gpu: bool | None = None
    cache_features: bool | None = None
    cache_dir: str = ""
    bucketing: bool | None = None
    mel_on_device: bool | None = None
    shuffle_buffer_size: int = 2048
    deterministic: bool = False
    service_address: str = ""
    service_timeout_s: float = 60.0

    @property
    def frames_per_second(self) -> float:
        return self.sample_rate / self.hop_length

    @property
    def mel_fmax(self) -> float:
        """The mel filterbank's upper edge in Hz (`fmax: 0` means the Nyquist frequency)."""
        return self.fmax if self.fmax > 0 else self.sample_rate / 2

    def frames_for_samples(self, num_samples: int) -> int:
        """Frames of a centered STFT over `num_samples` samples (librosa's `center=True`)."""
        return 1 + num_samples // self.hop_length

    @property
    def reference_samples(self) -> int:
        return int(round(self.reference_duration_s * self.sample_rate))

    @property
    def reference_frames(self) -> int:
        return self.frames_for_samples(self.reference_samples)

    @property
    def bucket_mel_lengths(self) -> list[int]:
        """Padded mel length of each bucket: the longest clip it holds, rounded up to a multiple of 8."""
        return [
            _round_up(self.frames_for_samples(int(seconds * self.sample_rate)), 8)
            for seconds in self.bucket_boundaries_s
        ]

    @property
    def bucket_text_lengths(self) -> list[int]:
        """Padded token length of each bucket (characters plus BOS and EOS), a multiple of 8."""
        return [
            _round_up(int(seconds * self.max_chars_per_second) + 2, 8)
            for seconds in self.bucket_boundaries_s
        ]


@dataclass
class ModelConfig:
    size: Literal["tiny", "small", "base"] = "small"


@dataclass
class TrainingConfig:
    optimization_level: OptimizationLevel = "enhanced"
    enable_graph_mode: bool | None = None
    enable_xla_compilation: bool | Literal["auto"] | None = None
    precision: Precision | None = None
    gradient_accumulation_steps: int = 0
    effective_batch_size: int = 32
    optimizer: Literal["adamw", "prodigy"] = "adamw"
    learning_rate: float = 1e-3
    warmup_steps: int = 200
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    max_steps: int = 2000
    steps_per_execution: int = 0
    log_interval: int = 25
    eval_interval: int = 200
    checkpoint_interval: int = 200
    max_nonfinite_steps: int = 25
    gradient_checkpointing: bool = False
    decoder_window: int = 0
    alignment_frames_per_iteration: int = 0
    lr_decay_fraction: float = 1.0
    log_samples: bool = True
    wer_sentences: int = 24
    voice_sentences: int = 2
    speaker_loss_weight: float = 0.0
    init_from: str = ""
    vocoder: str = ""


InputRoute = Literal["auto", "keys", "on_the_fly", "cached_features", "mel_on_device"]


@dataclass
class HardwareConfig:
    input_route: InputRoute = "auto"
    persistent_xla_cache: bool | Literal["auto"] = "auto"


@dataclass
class Config:
    seed: int = 1234
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)


# What each optimization level sets. Only keys left `null` are filled in; see the module docstring.
PRESETS: dict[str, dict[str, Any]] = {
    "basic": {
        "training.enable_graph_mode": True,
        "training.enable_xla_compilation": False,
        "training.precision": "fp32",
        "data.cache_features": False,
        "data.prefetch_to_gpu": False,
        "data.bucketing": False,
        "data.mel_on_device": False,
        "training.steps_per_execution": 1,
    },
    "enhanced": {
        "training.enable_graph_mode": True,
        "training.enable_xla_compilation": "auto",  # the hardware plan's: on for GPUs, off on a CPU
        "training.precision": "auto",
        "data.cache_features": True,
        "data.prefetch_to_gpu": True,
        "data.bucketing": True,
        "data.mel_on_device": False,
        "training.steps_per_execution": 1,
    },
}
# Experimental: several train steps per compiled call (fewer host round trips; the progress bar and
# callbacks then see every 4th step).
# And log-mels computed in the compiled step, for hosts whose CPUs cannot keep up with the GPU.
PRESETS["experimental"] = {**PRESETS["enhanced"], "training.steps_per_execution": 4, "data.mel_on_device": True}


# The keys that hold a file or folder: `~/` at their start is the home folder's, as in a shell.
PATH_KEYS = frozenset({"data.train_data", "data.val_data", "data.unseen_voices_data", "data.cache_dir",
                       "training.init_from", "training.vocoder"})


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# --------------------------------------------------------------------------------------------------
# Loading


def load_config(
    path: str | os.PathLike | None = None,
    *,
    overrides: typing.Sequence[str] = (),
    optimization_level: str | None = None,
) -> Config:
    """Build the config: defaults, then the YAML file, then `key=value` overrides, then the preset.

    `optimization_level`, when given (the `--optimization-level` flag), replaces
    `training.optimization_level` from the file.
    """
    config = Config()
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {source}") from None
        except IsADirectoryError:
            raise ConfigError(f"{source} is a folder, not a config file; pass a YAML file such as configs/config.yaml") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{source} is not a text file (not UTF-8), so not a config; pass a YAML file such as "
                              "configs/config.yaml") from None
        except OSError as error:  # no permission, a device, ...
            raise ConfigError(f"{source}: cannot read the config file ({error.strerror or error})") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{source}: not valid YAML: {error}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
        for key, value in _flatten(raw, source):
            set_value(config, key, value, source=source)
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {override!r}: expected key=value, e.g. --set data.batch_size=16")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"--set {override!r}: the value is not valid YAML ({getattr(error, 'problem', None) or error}); "
                              "quote it, e.g. --set 'data.cache_dir=\"/tmp/my cache\"'") from None
        set_value(config, key.strip(), value, source="--set")
    if optimization_level is not None:
        set_value(config, "training.optimization_level", optimization_level, source="--optimization-level")
    apply_preset(config)
    validate(config)
    return config


def override(key: str, value: Any) -> str:
    """`key=value` for load_config's overrides, a string quoted: a flag's path (`--train-data 2024`,
    `"my corpus #2"`, `[v2]/data.jsonl`, `@home/x`) is the path, not YAML read as a number, a comment or an alias."""
    return f"{key}={json.dumps(value, ensure_ascii=False) if isinstance(value, str) else value}"


def _flatten(raw: dict, source: str, prefix: str = "") -> typing.Iterator[tuple[str, Any]]:
    # No field holds a mapping, so every mapping is a section (known or misspelt: either way the
    # full dotted key reaches set_value, which names it in the error).
    sections = {f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory)} \
        if not prefix else set()
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten(value, source, dotted + ".")
        elif dotted in sections and value is None:
            continue  # `data:` with every key under it commented out: an empty section, the defaults
        elif dotted in sections:
            raise ConfigError(f"{source}: '{dotted}' is a section, not a key (got {value!r}): write its keys indented "
                              f"under it, one a line, as configs/config.yaml does")
        else:
            yield dotted, value


def all_keys(node: Any = None, prefix: str = "") -> list[str]:
    """Every valid dotted key, e.g. `data.batch_size`."""
    node = Config() if node is None else node
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys.extend(all_keys(value, f"{prefix}{f.name}."))
        else:
            keys.append(prefix + f.name)
    return keys


def set_value(config: Config, key: str, value: Any, *, source: str) -> None:
    """Set one dotted key after checking that it exists and that `value` has an allowed type."""
    parts = key.split(".")
    node: Any = config
    for part in parts[:-1]:
        child = getattr(node, part, None) if part in _field_names(node) else None
        if not dataclasses.is_dataclass(child):
            raise _unknown_key(key, source)
        node = child
    name = parts[-1]
    if name not in _field_names(node) or dataclasses.is_dataclass(getattr(node, name)):
        raise _unknown_key(key, source)
    hint = typing.get_type_hints(type(node))[name]
    value = _coerce(value, hint, key, source)
    if key in PATH_KEYS and value.startswith("~/"):
        value = os.path.expanduser(value)  # no shell expanded it in a YAML file or after `--set key=`
    setattr(node, name, value)


def _field_names(node: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else set()


def _unknown_key(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; see configs/config.yaml for every key"
    return ConfigError(f"{source}: unknown key '{key}'{hint}")


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check `value` against the field's annotation; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key, source)
            except ConfigError:
                pass
        raise ConfigError(f"{source}: {key} must be {_describe(hint)}, got {value!r}{_unquoted(value)}")
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"{source}: {key} must be one of {', '.join(map(str, allowed))}; got {value!r}{_unquoted(value)}")
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key} must be a list of {item.__name__}, got {value!r}")
        return [_coerce(v, item, key, source) for v in value]
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        number = value
        if isinstance(value, str):
            # YAML 1.1 (PyYAML) reads `1e-4` as a string; it wants `1.0e-4`, which few people write.
            try:
                number = float(value)
            except ValueError:
                pass
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if not math.isfinite(number):
                raise ConfigError(f"{source}: {key} must be a finite number, got {value!r}")
            return float(number)
    elif hint is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{source}: {key} must be {_describe(hint)}, got {value!r}{_unquoted(value)}")


def _unquoted(value: Any) -> str:
    """A hint for a boolean where a bool is not wanted: YAML 1.1 read a bare word as one (`language: no`)."""
    if isinstance(value, bool):
        return " (YAML reads an unquoted yes, no, on or off as true or false: quote the word, e.g. \"no\")"
    return ""


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if h is type(None) else _describe(h) for h in typing.get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def get_value(config: Config, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def apply_preset(config: Config) -> None:
    """Fill every key still `null` (or 0 for counts, meaning automatic) from the optimization level."""
    if config.data.service_address and config.data.cache_features is None:
        # The service's workers compute the training features every epoch, so the levels' cache
        # (true) would be an error here (see `validate`): an unset key means no cache.
        config.data.cache_features = False
    for key, value in PRESETS[config.training.optimization_level].items():
        current = get_value(config, key)
        if current is None or (type(current) is int and current == 0):  # not `in (None, 0)`: False == 0
            set_value(config, key, value, source=f"preset {config.training.optimization_level}")


# What `tf.data.experimental.service.distribute` accepts as a dispatcher: an optional protocol, a
# host name or address, a port.
_SERVICE_ADDRESS = re.compile(r"(grpc://)?(\[[0-9A-Fa-f:]+\]|[^\s:/\[\]]+):\d+")


def validate(config: Config) -> None:
    """Checks across fields: each message says which key to change and to what."""
    d, t = config.data, config.training
    problems = []
    if not 0 <= config.seed < 2**32:  # the range of numpy's and Keras' seeding
        problems.append(f"seed must be in 0..{2**32 - 1}, got {config.seed}")
    if not d.language.strip() or d.language != d.language.strip():
        # Whether espeak-ng knows the code is checked where text is phonemized (it loads espeak-ng).
        problems.append(f"data.language must be an espeak-ng voice or language code like en-us, fa or ko, got {d.language!r}")
    if d.sample_rate <= 0:
        problems.append(f"data.sample_rate must be positive, got {d.sample_rate}")
    if not 0 < d.win_length <= d.n_fft:
        problems.append(f"data.win_length ({d.win_length}) must be in 1..data.n_fft ({d.n_fft})")
    if d.n_fft % 2:
        problems.append(f"data.n_fft must be even, got {d.n_fft}")
    if not 0 < d.hop_length <= d.win_length:
        problems.append(f"data.hop_length ({d.hop_length}) must be in 1..data.win_length ({d.win_length})")
    if d.n_mels <= 0:
        problems.append(f"data.n_mels must be positive, got {d.n_mels}")
    if not 0 <= d.fmin < d.mel_fmax <= d.sample_rate / 2 or d.fmax < 0:  # a negative fmax is not 0's Nyquist
        problems.append(
            f"need 0 <= data.fmin < data.fmax <= sample_rate/2 ({d.sample_rate / 2:g}); "
            f"got fmin={d.fmin:g}, fmax={d.fmax:g} (fmax: 0 means sample_rate/2)"
        )
    if d.power not in (1.0, 2.0):
        problems.append(f"data.power must be 1.0 (magnitude) or 2.0 (power), got {d.power}")
    if d.log_floor <= 0:
        problems.append(f"data.log_floor must be positive, got {d.log_floor}")
    if not 0 <= d.peak_normalize <= 1:
        problems.append(f"data.peak_normalize must be in [0, 1] (0 turns it off), got {d.peak_normalize}")
    if d.trim_silence_db < 0:
        problems.append(f"data.trim_silence_db must be >= 0 (0 turns trimming off), got {d.trim_silence_db}")
    if not 0 <= d.min_duration_s < d.max_duration_s:
        problems.append(f"need 0 <= data.min_duration_s < data.max_duration_s; got {d.min_duration_s} and {d.max_duration_s}")
    if d.reference_duration_s <= 0:
        problems.append(f"data.reference_duration_s must be positive, got {d.reference_duration_s}")
    bounds = d.bucket_boundaries_s
    if not bounds or any(b <= 0 for b in bounds) or sorted(set(bounds)) != bounds:
        problems.append(f"data.bucket_boundaries_s must be positive and strictly increasing, got {bounds}")
    elif bounds[-1] < d.max_duration_s:
        problems.append(
            f"the last of data.bucket_boundaries_s ({bounds[-1]}) must be >= data.max_duration_s "
            f"({d.max_duration_s}): raise it or lower data.max_duration_s"
        )
    if d.max_chars_per_second <= 0:
        problems.append(f"data.max_chars_per_second must be positive, got {d.max_chars_per_second}")
    if not 0 <= d.val_fraction < 1:
        problems.append(f"data.val_fraction must be in [0, 1), got {d.val_fraction}")
    for key in ("batch_size", "num_workers", "prefetch_buffer_size", "shuffle_buffer_size"):
        if getattr(d, key) < 0:
            problems.append(f"data.{key} must be >= 0 (0 = automatic), got {getattr(d, key)}")
    if d.service_timeout_s <= 0:
        problems.append(f"data.service_timeout_s must be > 0 (seconds without a serving tf.data service before "
                        f"training stops), got {d.service_timeout_s}")
    if d.service_address:
        if not _SERVICE_ADDRESS.fullmatch(d.service_address):
            problems.append(f"data.service_address must be grpc://host:port (the dispatcher's), got {d.service_address!r}")
        if config.hardware.input_route == "cached_features":
            problems.append("hardware.input_route: cached_features does not go with data.service_address: the "
                            "service's workers compute the features every epoch; set it to auto or on_the_fly")
        if d.cache_features:
            # A cache on the workers would be wrong: dynamic sharding hands each worker other clips
            # every epoch. One here would leave the service idle after the first epoch.
            problems.append("data.cache_features: true does not go with data.service_address: the service's workers "
                            "compute the features every epoch; set data.cache_features: false (or leave it null)")
        if d.deterministic:
            problems.append("data.deterministic: true does not go with data.service_address: clips arrive in the order "
                            "the service's workers finish them; set data.deterministic: false")
    if not 0.0 < t.lr_decay_fraction <= 1.0:
        problems.append(f"training.lr_decay_fraction must be in (0, 1], got {t.lr_decay_fraction}")
    if t.decoder_window < 0:
        problems.append(f"training.decoder_window must be >= 0 (0 = whole clips), got {t.decoder_window}")
    if t.alignment_frames_per_iteration < 0:
        problems.append(f"training.alignment_frames_per_iteration must be >= 0 (0 = automatic), "
                        f"got {t.alignment_frames_per_iteration}")
    if t.speaker_loss_weight < 0:
        problems.append(f"training.speaker_loss_weight must be >= 0 (0 = off), got {t.speaker_loss_weight}")
    if t.voice_sentences < 0:
        problems.append(f"training.voice_sentences must be >= 0 (0 = off), got {t.voice_sentences}")
    if t.wer_sentences < 0:
        problems.append(f"training.wer_sentences must be >= 0 (0 = off), got {t.wer_sentences}")
    if t.gradient_accumulation_steps < 0:
        problems.append(f"training.gradient_accumulation_steps must be >= 0 (0 = automatic), got {t.gradient_accumulation_steps}")
    for key in ("learning_rate", "max_steps", "log_interval", "eval_interval", "checkpoint_interval", "max_nonfinite_steps"):
        if getattr(t, key) <= 0:
            problems.append(f"training.{key} must be positive, got {getattr(t, key)}")
    for key in ("warmup_steps", "weight_decay", "clip_norm", "steps_per_execution"):
        if getattr(t, key) < 0:
            problems.append(f"training.{key} must be >= 0, got {getattr(t, key)}")
    if t.optimizer == "prodigy" and 0 < t.learning_rate < 0.1:
        # It scales the step size estimate's own growth too: at AdamW's 0.001 it stays at its start, 1e-6.
        problems.append(f"training.learning_rate multiplies Prodigy's own step size: use 1.0 (below 0.1 Prodigy's "
                        f"estimate of it stalls and the run barely trains), got {t.learning_rate}")
    if t.effective_batch_size <= 0:
        problems.append(f"training.effective_batch_size must be positive, got {t.effective_batch_size}")
    if t.enable_xla_compilation is True and t.enable_graph_mode is False:
        problems.append(
            "training.enable_xla_compilation: true needs training.enable_graph_mode: true "
            "(XLA compiles graphs; eager mode is for debugging)"
        )
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def load_run_config(path: str | os.PathLike) -> Config:
    """A run's saved config.yaml, as `load_config` reads it, except that a run saved before
    `data.text_frontend` existed gets `characters`: its vocab.txt holds characters, not phonemes."""
    config = load_config(path)
    config.data.text_frontend = saved_text_frontend(yaml.safe_load(Path(path).read_text(encoding="utf-8")))
    return config


def saved_text_frontend(saved: Any) -> str:
    """`data.text_frontend` of a saved config (a parsed YAML mapping); characters if it predates the key."""
    data = saved.get("data") if isinstance(saved, dict) else None
    return data.get("text_frontend", "characters") if isinstance(data, dict) else "characters"


def save_config(config: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config next to a run, so the run can be reproduced and resumed."""
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False), encoding="utf-8")
