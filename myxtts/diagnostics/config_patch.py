"""`--apply`: a copy of the YAML config with the recommended keys set, next to the original.

The original is never written: the copy is `<name>.diagnosed.yaml` beside it, holding the original
file's keys plus the recommendations that name a config key (code changes cannot be applied), with
a header saying what changed and why. The copy is loaded with `myxtts.config.load_config` before
it replaces an earlier one, so a copy that does not load is removed and reported instead of left
behind, and the earlier copy stays.
Overrides given on the command line (`--set`, `--train-data`, ...) are not written into it.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from myxtts.config import ConfigError, load_config


def patched_path(original: str | os.PathLike) -> Path:
    original = Path(original)
    return original.with_name(f"{original.stem}.diagnosed.yaml")


def _set_nested(tree: dict, dotted_key: str, value) -> None:
    *sections, name = dotted_key.split(".")
    node = tree
    for section in sections:
        child = node.get(section)
        if not isinstance(child, dict):
            child = node[section] = {}
        node = child
    node[name] = value


def write_patched_config(original: str | os.PathLike, recommendations: list[dict]) -> tuple[Path | None, list[str]]:
    """Write the patched copy; returns (its path, the applied `key: value` lines), or (None, []) when
    no recommendation names a config key."""
    original = Path(original)
    target = patched_path(original)
    if target.resolve() == original.resolve():  # cannot happen with the suffix, but never risk it
        raise ValueError(f"refusing to overwrite the original config {original}")
    changes = [item for item in recommendations if item["key"] is not None]
    if not changes:
        return None, []
    raw = yaml.safe_load(original.read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{original}: the top level must be a mapping of sections")
    for item in changes:
        _set_nested(raw, item["key"], item["value"])
    header = [f"# {target.name}: {original.name} with the changes recommended by utilities/diagnose_gpu_bottleneck.py",
              "# (the original is unchanged; command-line overrides of that run are not included):"]
    header += [f"#   {item['change']}  <- {item['reason']}" for item in changes]
    # Written beside it and loaded before it replaces an earlier copy (perhaps edited by hand): a copy
    # that does not load leaves that one as it was.
    partial = target.with_name(f"{target.name}.partial")
    partial.write_text("\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    try:
        load_config(partial)
    except ConfigError:
        partial.unlink()
        raise
    os.replace(partial, target)
    return target, [item["change"] for item in changes]
