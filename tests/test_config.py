"""The config tree: YAML mirrors the defaults, strict keys and types, presets and their precedence."""

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from myxtts import config as cfg
from myxtts.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_config_yaml_mirrors_the_dataclass_defaults():
    raw = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
    defaults = cfg.to_dict(cfg.Config())
    assert raw == defaults | {"hardware": raw["hardware"]} and raw["hardware"] == defaults["hardware"]


def test_every_key_is_documented_by_a_comment_in_config_yaml():
    lines = (ROOT / "configs" / "config.yaml").read_text().splitlines()
    for key in cfg.all_keys():
        leaf = key.rsplit(".", 1)[-1]
        line = next((l for l in lines if re.match(rf"\s*{leaf}:", l)), None)
        assert line is not None and "#" in line, f"{key} has no documented line in configs/config.yaml"


# --------------------------------------------------------------------------------------------------
# "Every key does something": a key counts as read where an expression known to be its section (or the
# Config) has it as an attribute, not where the word appears after any dot (`gpu.size`, `batch.size`).

_SECTIONS = {"data": cfg.DataConfig, "model": cfg.ModelConfig, "training": cfg.TrainingConfig,
             "hardware": cfg.HardwareConfig}
_TYPE_OF_CLASS = {"Config": "Config", **{section_class.__name__: name for name, section_class in _SECTIONS.items()}}


def _annotation_type(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # "Config" written as a string
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.BinOp):  # DataConfig | None
        return _annotation_type(node.left) or _annotation_type(node.right)
    return _TYPE_OF_CLASS.get(node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None))


def _config_type(node, names: dict) -> str | None:
    """"Config", a section name ("data", ...) or None: what `node` is, as far as the code shows.

    Known: names bound in the scope (from such expressions, or annotated parameters), `config`,
    `x.config`, `data_config`, `<Config>.data`, `load_config(...)`, `dataclasses.replace(<known>, ...)`.
    """
    if isinstance(node, ast.Name):
        return names.get(node.id, {"config": "Config", "cfg": "Config", "data_config": "data"}.get(node.id))
    if isinstance(node, ast.Attribute):
        if node.attr in ("config", "data_config"):
            return "Config" if node.attr == "config" else "data"
        return node.attr if node.attr in _SECTIONS and _config_type(node.value, names) == "Config" else None
    if isinstance(node, ast.Call):
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if called == "load_config":
            return "Config"
        if called == "replace" and node.args:
            return _config_type(node.args[0], names)
    return None


def _scope_names(scope) -> dict:
    names = {}
    arguments = getattr(scope, "args", None)
    for argument in (arguments.posonlyargs + arguments.args + arguments.kwonlyargs) if arguments else []:
        if argument.annotation is not None and _annotation_type(argument.annotation):
            names[argument.arg] = _annotation_type(argument.annotation)
    for _ in range(2):  # `t, d = config.training, config.data`, then `c = d`
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs = [(target, node.value)]
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs = list(zip(target.elts, node.value.elts))
                    for name, value in pairs:
                        if isinstance(name, ast.Name) and _config_type(value, names):
                            names[name.id] = _config_type(value, names)
    return names


def config_reads(source: str) -> set[tuple[str, str]]:
    """(section or "Config", attribute) for every attribute read on a config object in `source`."""
    tree = ast.parse(source)
    found = set()
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        names = _scope_names(scope)
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _config_type(node.value, names):
                found.add((_config_type(node.value, names), node.attr))
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and _config_type(node.args[0], names)):
                found.add((_config_type(node.args[0], names), node.args[1].value))
    return found


def _with_derived_members(found: set) -> set:
    """Adds the fields that each read property or method of a section reads (bucket_mel_lengths ->
    bucket_boundaries_s, sample_rate, hop_length via frames_for_samples, ...)."""
    found = set(found)
    for section, section_class in _SECTIONS.items():
        uses = {}
        for name, member in vars(section_class).items():
            function = member.fget if isinstance(member, property) else member if inspect.isfunction(member) else None
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(function))) if function else None
            except OSError:  # made by @dataclass (__init__, __eq__), not ours
                continue
            if tree is not None:
                uses[name] = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                              and getattr(n.value, "id", None) == "self"}
        grown = True
        while grown:
            before = len(found)
            for name, fields in uses.items():
                if (section, name) in found:
                    found |= {(section, field) for field in fields}
            grown = len(found) > before
    return found


def unread_keys(sources: list[str]) -> list[str]:
    found = _with_derived_members(set().union(*(config_reads(source) for source in sources)))
    return [key for key in cfg.all_keys() if (tuple(key.split(".")) if "." in key else ("Config", key)) not in found]


def test_every_key_is_read_somewhere_outside_the_config_module():
    files = [p for folder in ("myxtts", "utilities") for p in (ROOT / folder).rglob("*.py") if p.name != "config.py"]
    sources = [p.read_text(encoding="utf-8") for p in files + [ROOT / "train_main.py"]]
    sources.append(textwrap.dedent(inspect.getsource(cfg.apply_preset)))  # the loader reads the optimization level
    assert unread_keys(sources) == [], "config keys nothing reads"


def test_a_key_counts_as_read_only_on_a_config_object():
    everything = cfg.all_keys()
    read_elsewhere = "def f(gpu, batch):\n    return gpu.size, batch.shuffle_buffer_size, batch.data.seed\n"
    assert unread_keys([read_elsewhere]) == everything  # the same words on other objects read nothing
    read = ("def f(config, c: DataConfig):\n"
            "    t, d = config.training, config.data\n"
            "    local = dataclasses.replace(config, seed=1)\n"
            "    return config.model.size, c.shuffle_buffer_size, t.max_steps, local.seed, d.bucket_mel_lengths\n")
    unread = unread_keys([read])
    for key in ("model.size", "data.shuffle_buffer_size", "training.max_steps", "seed",
                "data.bucket_boundaries_s", "data.sample_rate", "data.hop_length"):  # the last three via the property
        assert key not in unread, key
    assert "data.n_mels" in unread and "training.learning_rate" in unread


def test_unknown_key_names_key_file_and_closest_match(tmp_path):
    path = _write(tmp_path, "data:\n  batch_sise: 8\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message and "data.batch_sise" in message and "data.batch_size" in message


def test_unknown_section_is_reported(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'trainig.precision'.*training.precision"):
        load_config(_write(tmp_path, "trainig:\n  precision: fp32\n"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("data:\n  batch_size: eight\n", "data.batch_size must be an integer"),
        ("data:\n  batch_size: true\n", "data.batch_size must be an integer"),
        ("training:\n  precision: fp8\n", "training.precision must be"),
        ("data:\n  mel_scale: bark\n", "one of slaney, htk"),
        ("data:\n  bucket_boundaries_s: 3\n", "a list of"),
        ("data:\n  prefetch_to_gpu: maybe\n", "true or false or null"),
    ],
)
def test_wrong_types_say_what_is_allowed(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(_write(tmp_path, text))


@pytest.mark.parametrize(
    "override, expected",
    [
        ("data.win_length=2048", "data.win_length (2048) must be in 1..data.n_fft"),
        ("data.fmax=20000", "fmax"),
        ("data.fmax=-5", "got fmin=0, fmax=-5 (fmax: 0 means sample_rate/2)"),  # was taken as 0
        ("data.max_duration_s=20", "raise it or lower data.max_duration_s"),
        ("data.bucket_boundaries_s=[4, 2, 12]", "strictly increasing"),
        ("data.batch_size=-1", "data.batch_size must be >= 0"),
        ("data.power=3", "data.power must be 1.0"),
        ("data.language=", "data.language must be an espeak-ng voice or language code"),
        ("data.text_frontend=letters", "data.text_frontend must be one of phonemes, characters"),
        ("data.service_address=dispatcher", "data.service_address must be grpc://host:port"),
        ("data.service_address=grpc://a b:5050", "data.service_address must be grpc://host:port"),
    ],
)
def test_impossible_values_are_rejected(override, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(overrides=[override])


def test_floats_in_exponent_notation_are_numbers(tmp_path):
    # PyYAML reads `1e-4` (no dot) as a string; a float key takes it as the number it means.
    config = load_config(_write(tmp_path, "training:\n  learning_rate: 1e-4\n"), overrides=["training.weight_decay=2E-2"])
    assert config.training.learning_rate == 1e-4 and config.training.weight_decay == 0.02
    for value in ("nan", ".inf", "1e400"):
        with pytest.raises(ConfigError, match="training.learning_rate must be a finite number"):
            load_config(overrides=[f"training.learning_rate={value}"])


def test_xla_without_graph_mode_is_refused():
    with pytest.raises(ConfigError, match="enable_graph_mode: true"):
        load_config(overrides=["training.enable_graph_mode=false", "training.enable_xla_compilation=true"])


def test_prodigy_at_adamws_learning_rate_is_refused():
    # `--optimizer prodigy` alone kept AdamW's 0.001, which also scales Prodigy's estimate of its step
    # size: that stayed at its start (1e-6) and the run never moved.
    with pytest.raises(ConfigError, match=re.escape("training.learning_rate multiplies Prodigy's own step size: "
                                                    "use 1.0 (below 0.1")):
        load_config(overrides=["training.optimizer=prodigy"])
    assert load_config(overrides=["training.optimizer=prodigy", "training.learning_rate=1.0"]).training.learning_rate == 1.0


def test_a_path_from_the_home_folder_is_taken_as_the_shell_takes_it(tmp_path, monkeypatch):
    # `data.cache_dir: ~/cache` made a folder named "~" under the current one and cached there, silently.
    monkeypatch.setenv("HOME", str(tmp_path))
    config = load_config(_write(tmp_path, "data:\n  cache_dir: ~/cache\n"), overrides=["training.vocoder=~/vocoder"])
    assert (config.data.cache_dir, config.training.vocoder) == (f"{tmp_path}/cache", f"{tmp_path}/vocoder")


def test_set_override_must_be_key_value():
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(overrides=["data.batch_size"])


@pytest.mark.parametrize("value", ["[2, 4, 12", "*x", "\t3"])
def test_a_set_value_that_is_not_yaml_is_named_with_how_to_quote_it(value):
    with pytest.raises(ConfigError) as error:  # was PyYAML's ParserError / ComposerError traceback
        load_config(overrides=[f"data.bucket_boundaries_s={value}"])
    assert str(error.value).startswith(f"--set {'data.bucket_boundaries_s=' + value!r}: the value is not valid YAML (")
    assert "quote it" in str(error.value)


def test_a_section_with_every_key_commented_out_is_empty_and_a_section_given_a_value_is_named(tmp_path):
    # A copy of configs/config.yaml with the keys under `data:` commented out was "unknown key 'data';
    # did you mean 'data.fmin'?".
    config = load_config(_write(tmp_path, "data:\n  # batch_size: 8\ntraining:\n  max_steps: 7\n"))
    assert config.data.batch_size == load_config().data.batch_size and config.training.max_steps == 7
    with pytest.raises(ConfigError, match=re.escape("'data' is a section, not a key (got 5): write its keys indented")):
        load_config(_write(tmp_path, "data: 5\n"))


def test_presets_fill_only_unset_keys(tmp_path):
    basic = load_config(optimization_level="basic")
    enhanced = load_config(optimization_level="enhanced")
    assert (basic.training.enable_xla_compilation, basic.training.precision, basic.data.bucketing) == (False, "fp32", False)
    # enhanced leaves XLA to the hardware plan (on for GPUs)
    assert (enhanced.training.enable_xla_compilation, enhanced.training.precision, enhanced.data.bucketing) == ("auto", "auto", True)
    assert enhanced.data.cache_features and not basic.data.cache_features
    # An explicit YAML key beats the preset; --set beats the YAML; the flag beats the YAML's level.
    path = _write(tmp_path, "training:\n  optimization_level: basic\n  enable_xla_compilation: true\ndata:\n  bucketing: true\n")
    mixed = load_config(path, overrides=["data.bucketing=false"])
    assert mixed.training.optimization_level == "basic"
    assert mixed.training.enable_xla_compilation is True and mixed.data.bucketing is False
    assert load_config(path, optimization_level="enhanced").training.optimization_level == "enhanced"


def test_a_service_address_means_no_feature_cache_and_no_fixed_order():
    # The levels' cache would be refused with a service address, so an unset key becomes false...
    for address in ("grpc://10.0.0.1:5050", "localhost:5050", "grpc://[::1]:5050"):
        config = load_config(overrides=[f"data.service_address={address}"], optimization_level="enhanced")
        assert config.data.cache_features is False
    # ...and an explicit cache, or a promise of the same order, is an error naming the key to change.
    with pytest.raises(ConfigError, match=re.escape("set data.cache_features: false")):
        load_config(overrides=["data.service_address=grpc://host:5050", "data.cache_features=true"])
    with pytest.raises(ConfigError, match=re.escape("set data.deterministic: false")):
        load_config(overrides=["data.service_address=grpc://host:5050", "data.deterministic=true"])
    assert load_config(optimization_level="enhanced").data.cache_features  # without an address, the level's cache


def test_every_level_resolves_every_null():
    for level in cfg.PRESETS:
        config = load_config(optimization_level=level)
        nulls = [k for k in cfg.all_keys() if cfg.get_value(config, k) is None]
        assert not nulls, f"level {level} leaves {nulls} unset"


def test_unknown_optimization_level():
    with pytest.raises(ConfigError, match="one of basic, enhanced, experimental"):
        load_config(optimization_level="turbo")


def test_demo_config_overrides_only_a_few_fields():
    demo = load_config(ROOT / "configs" / "demo.yaml")
    differing = [k for k in cfg.all_keys() if cfg.get_value(demo, k) != cfg.get_value(load_config(), k)]
    assert 0 < len(differing) <= 10, differing


def test_saved_config_loads_back_to_the_same_values(tmp_path):
    original = load_config(overrides=["data.n_mels=64", "seed=7"], optimization_level="basic")
    cfg.save_config(original, tmp_path / "saved.yaml")
    assert dataclasses.asdict(load_config(tmp_path / "saved.yaml")) == dataclasses.asdict(original)


def test_a_run_saved_before_the_text_frontend_key_reads_characters(tmp_path):
    original = load_config(overrides=["data.language=fa"])
    cfg.save_config(original, tmp_path / "new.yaml")
    assert cfg.load_run_config(tmp_path / "new.yaml").data.text_frontend == "phonemes"
    saved = yaml.safe_load((tmp_path / "new.yaml").read_text())
    del saved["data"]["text_frontend"]  # as written by a run from before the phoneme front end
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(saved))
    assert cfg.load_run_config(tmp_path / "old.yaml").data.text_frontend == "characters"
    assert load_config(tmp_path / "old.yaml").data.text_frontend == "phonemes"  # a plain load takes the default


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path, "- just\n- a list\n"))


def test_derived_bucket_sizes_follow_the_boundaries():
    data = load_config(overrides=["data.bucket_boundaries_s=[3.0, 12.0]"]).data
    assert data.bucket_mel_lengths == [264, 1040]  # 1 + 3*22050//256 = 259 -> 264; 1 + 264600//256 = 1034 -> 1040
    assert data.bucket_text_lengths == [80, 304]  # 3*25+2 = 77 -> 80; 12*25+2 = 302 -> 304
    assert all(n % 8 == 0 for n in data.bucket_mel_lengths + data.bucket_text_lengths)


def test_the_voices_recipe_is_the_demo_trained_longer_on_other_corpora():
    # configs/voices.yaml states the settings its numbers were measured with: the demo's but for these.
    voices, demo = load_config(ROOT / "configs" / "voices.yaml"), load_config(ROOT / "configs" / "demo.yaml")
    differing = {k: cfg.get_value(voices, k) for k in cfg.all_keys() if cfg.get_value(voices, k) != cfg.get_value(demo, k)}
    assert differing == {"data.train_data": "voices_corpus", "data.unseen_voices_data": "heldout_corpus",
                         "training.max_steps": 11200, "training.eval_interval": 2800}


@pytest.mark.parametrize("override", ["data.language=no", "data.text_frontend=on", "training.optimizer=yes"])
def test_a_bare_yes_no_on_or_off_where_a_word_is_wanted_says_to_quote_it(override):
    """`language: no` (Norwegian) said only "must be a string, got False": YAML 1.1 read the bare word as false."""
    with pytest.raises(ConfigError, match=r"got (True|False) \(YAML reads an unquoted yes, no, on or off as true or "
                                          r"false: quote the word"):
        load_config(overrides=[override])
    assert load_config(overrides=['data.language="no"']).data.language == "no"
