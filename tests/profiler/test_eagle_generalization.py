"""scripts/eagle_generalization.py refuses missing inputs before it loads the target."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")


def generalization_script():
    script = Path(__file__).resolve().parents[2] / "scripts" / "eagle_generalization.py"
    spec = importlib.util.spec_from_file_location("eagle_generalization", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flag", ["--head", "--data"])
def test_a_missing_head_or_data_file_is_named_in_a_clear_error(flag, tmp_path, capsys,
                                                                monkeypatch):
    module = generalization_script()
    monkeypatch.setattr(module, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as stopped:
        module.main([flag, str(tmp_path / "absent.npz")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} {tmp_path / 'absent.npz'}: no such file" in err
