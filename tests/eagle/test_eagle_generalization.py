"""scripts/eagle_generalization.py refuses missing inputs before it loads the target."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from support.scripts import load_script


@pytest.mark.parametrize("flag", ["--head", "--data"])
def test_a_missing_head_or_data_file_is_named_in_a_clear_error(flag, tmp_path, capsys,
                                                                monkeypatch):
    module = load_script("eagle_generalization")
    monkeypatch.setattr(module, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as stopped:
        module.main([flag, str(tmp_path / "absent.npz")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} {tmp_path / 'absent.npz'}: no such file" in err
