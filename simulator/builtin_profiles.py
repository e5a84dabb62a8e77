"""Profiles shipped inside the package, usable by name: `spectune simulate --profile NAME`.

Each lives in `simulator/data/profiles/NAME/` as written by `spectune profile --out`: the table
(`latency.csv`, `latency.meta.json` naming the device it was timed on), the ragged batches timed
for validation, the raw samples and the summary with the model's measured error.
"""

from __future__ import annotations

from pathlib import Path

from simulator.errors import ConfigError

DATA = Path(__file__).parent / "data" / "profiles"


def builtin_profile_names() -> list[str]:
    if not DATA.is_dir():
        return []
    return sorted(p.name for p in DATA.iterdir() if (p / "latency.csv").exists())


def resolve_profile(name_or_path: str) -> Path:
    """The table prefix (…/latency) of a profile folder, a table path, or a shipped name."""
    path = Path(name_or_path)
    if path.is_dir():
        return path / "latency"
    if path.exists() or path.with_suffix(".csv").exists():
        return path.with_suffix("") if path.suffix == ".csv" else path
    if name_or_path in builtin_profile_names():
        return DATA / name_or_path / "latency"
    known = ", ".join(builtin_profile_names()) or "none shipped"
    raise ConfigError(f"--profile {name_or_path!r}: no such folder, and no shipped profile of "
                      f"that name (shipped: {known})")
