"""The one progress bar of the image commands and of training: drawn on a terminal only, lines
printed above it while it is drawn, plain lines otherwise."""
from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mlxnet import progress
from mlxnet.cli import app


@pytest.fixture
def screen(monkeypatch) -> io.StringIO:
    """The progress console as a terminal that writes into a string."""
    drawn = io.StringIO()
    monkeypatch.setattr(progress, "progress_console",
                        lambda: Console(file=drawn, force_terminal=True, width=120, color_system=None))
    return drawn


def test_a_bar_on_a_terminal_shows_the_count_rate_status_and_eta(screen, capsys):
    with progress.progress_bar("work", 3, unit="img", status=True) as bar:
        assert bar.drawn
        bar.advance("loss 0.5")
        bar.err("error: one line [red] stays as written")
        bar.advance()
        bar.advance()
    drawn = screen.getvalue()
    assert "work" in drawn and "3/3" in drawn and "img/s" in drawn and "loss 0.5" in drawn and "ETA" in drawn
    assert "error: one line [red] stays as written" in drawn
    assert capsys.readouterr().err == ""  # it went through the bar's console


def test_quiet_or_not_a_terminal_draws_nothing_and_prints_plain_lines(screen, monkeypatch, capsys):
    with progress.progress_bar("work", 2, quiet=True) as bar:
        assert not bar.drawn
        bar.advance("ignored")
        bar.out("a result")
        bar.err("error: a failure")
    assert screen.getvalue() == ""
    assert capsys.readouterr() == ("a result\n", "error: a failure\n")
    monkeypatch.setattr(progress, "progress_console", lambda: Console(file=io.StringIO(), force_terminal=False))
    with progress.progress_bar("work", 2) as bar:
        assert not bar.drawn


def test_a_transient_bar_is_stopped_when_its_block_fails(screen):
    with pytest.raises(RuntimeError), progress.progress_bar("epoch 1/1", 4, status=True, transient=True) as bar:
        bar.advance("loss 1.0")
        raise RuntimeError("stopped mid-epoch")
    drawn = screen.getvalue()
    # Stopped: the terminal's cursor is shown again after the bar's last frame.
    assert "loss 1.0" in drawn and drawn.rindex("\x1b[?25h") > drawn.rindex("loss 1.0")


def test_training_draws_the_epoch_bar_on_a_terminal(screen, tmp_path):
    from test_train import TINY, make_folder

    data = make_folder(tmp_path / "data", {"apple": (200, 40, 40), "sky": (40, 60, 200)}, per_class=4)
    result = CliRunner().invoke(app, ["train", "classify", str(data), *TINY, "--epochs", "1", "--val-split", "0",
                                      "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    drawn = screen.getvalue()
    assert "epoch 1/1" in drawn and "2/2" in drawn and "images/s" in drawn and "loss" in drawn
    assert "epoch 1/1" in result.stdout  # the epoch's line is logged as before
