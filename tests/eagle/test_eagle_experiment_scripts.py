"""scripts/eagle_document_finetune.py, scripts/eagle_context_window.py and scripts/eagle_tree.py
refuse bad arguments before they load the target."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from support.scripts import load_script


@pytest.mark.parametrize(("argv", "says"), [
    (["--arms", "control,more"], "--arms 'control,more': give control, docs or both"),
    (["--arms", ","], "--arms ',': give control, docs or both"),
    (["--replay", "0"], "--replay 0, --epochs 2, --lr 0.0003: give positive numbers"),
    (["--lr", "-1"], "--lr -1.0: give positive numbers"),
    (["--head", "absent.npz"], "--head absent.npz: no such file"),
    (["--data", "absent.npz"], "--data absent.npz: no such file"),
])
def test_bad_arguments_are_named_before_the_target_loads(argv, says, capsys, monkeypatch):
    module = load_script("eagle_document_finetune")
    monkeypatch.setattr(module, "load_smollm2", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit) as stopped:
        module.main(argv)
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("windows", ["", "512,abc", "-1", "0,100"])
def test_context_window_refuses_windows_it_cannot_measure(windows, capsys, monkeypatch):
    module = load_script("eagle_context_window")
    monkeypatch.setattr(module, "load_models", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit):
        module.main(["--windows", windows])
    assert f"--windows {windows!r}: give comma-separated positions" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "says"), [
    (["--nodes", "0"], "--nodes, --depth, --max-rank, --max-tokens and --threads must be >= 1"),
    (["--head", "absent.npz"], "--head absent.npz: no such file"),
])
def test_the_tree_builder_refuses_bad_arguments_before_the_target_loads(argv, says, capsys,
                                                                         monkeypatch):
    module = load_script("eagle_tree")
    monkeypatch.setattr(module, "load_models", lambda *a, **k: pytest.fail("loaded the target"))
    with pytest.raises(SystemExit):
        module.main(argv)
    assert says in capsys.readouterr().err
