"""What a cached simulation depends on, by content: the bytes of the files its scenario names
(workload, lengths, speculation trace, profile), the catalog entries its names resolve to, and
the code version (the simulator's sources and shipped data). `evaluate.Task.key` hashes them, so
an edited input or an upgrade is recomputed, never answered from a stale file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from spectune.simulate import SYNTHETIC, SimulationSpec

#: packages whose sources (and shipped data/) determine a simulation's result
CODE_PACKAGES = ("simulator", "policies", "traces")
#: modules of this package that evaluate() runs (of spectune.search it uses only Candidate, whose
#: values the key holds: tuning the search must not throw the cached simulations away)
CODE_MODULES = ("spectune.evaluate", "spectune.simulate")


@functools.cache
def code_version() -> str:
    """sha256 over the simulator's sources and shipped data (built-in traces, recordings,
    profiles), once per process: results cached by an older version are never reused."""
    digest = hashlib.sha256()
    for name, path in sorted(_code_files()):
        data = path.read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _code_files() -> Iterator[tuple[str, Path]]:
    """(stable name, path) of every .py source of CODE_PACKAGES and CODE_MODULES, and every
    file under the packages' data/ folders but their READMEs (prose changes no result)."""
    for package in CODE_PACKAGES:
        root = Path(importlib.import_module(package).__file__).parent  # type: ignore[arg-type]
        data = (p for p in (root / "data").rglob("*") if p.is_file() and p.suffix != ".md")
        files = [*root.rglob("*.py"), *data]
        for path in files:
            if "__pycache__" not in path.parts:
                yield f"{package}/{path.relative_to(root).as_posix()}", path
    for module in CODE_MODULES:
        yield module, Path(importlib.import_module(module).__file__)  # type: ignore[arg-type]


_FILE_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, hashed once per process per version of the file: a tune asks
    for the same file for every task, while an edit (another size, mtime, ctime or inode, as an
    editor's save or an atomic rewrite gives) is hashed again."""
    file = Path(path).resolve()
    st = file.stat()
    stamp = (str(file), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stamp not in _FILE_DIGESTS:
        with open(file, "rb") as handle:
            _FILE_DIGESTS[stamp] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _FILE_DIGESTS[stamp]


def file_or_none(text: str | None) -> str | None:
    """The digest of `text` if it names a file; None for names and specs (not files)."""
    return file_digest(text) if text and Path(text).is_file() else None


def input_contents(scenario: SimulationSpec) -> dict[str, object]:
    """What the scenario's names stand for, by content. Mirrors how simulate.py resolves each
    name (a built-in name wins over a file of that name; built-ins are in code_version())."""
    from traces import builtin_names
    from traces.builtin import speculation_names

    lengths = (scenario.lengths or "").strip()
    return {
        "workload": (None if scenario.workload in (*SYNTHETIC, *builtin_names())
                     else file_or_none(scenario.workload)),
        "lengths": None if lengths in builtin_names() else file_or_none(lengths),
        "acceptance": (None if scenario.acceptance in speculation_names()
                       else file_or_none(scenario.acceptance)),
        "profile": _profile_contents(scenario.profile),
        "catalog": _catalog_entries(scenario),
    }


def _profile_contents(profile: str | None) -> list[str | None] | None:
    """The digests of a profile's table (latency.csv, latency.meta.json)."""
    if profile is None:
        return None
    from simulator.builtin_profiles import resolve_profile
    from simulator.latency_table import table_paths

    return [file_or_none(str(p)) for p in table_paths(resolve_profile(profile))]


def _catalog_entries(scenario: SimulationSpec) -> list[dict] | None:
    """The catalog entries the roofline uses, field by field (the defaults are build_latency's);
    None with a profile, which brings its own models."""
    if scenario.profile is not None:
        return None
    from simulator import get_gpu, get_model

    draft = scenario.draft or "Llama-68M"
    entries = [get_model(scenario.target or "Llama-3.1-8B"), get_gpu(scenario.hardware or
                                                                    "H100-SXM")]
    if draft.lower() not in ("none", "ngram", ""):
        entries.append(get_model(draft))
    return [asdict(e) for e in entries]
