"""`unitok --help` lists every subcommand — LightningCLI's four and the hand-dispatched `sample` —
and `unitok sample --help` still shows sample's own options."""

from __future__ import annotations

import pytest

from tasks.cli import SAMPLE_HELP, main


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_top_level_help_lists_every_subcommand(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([flag])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "{fit,validate,test,predict,sample}" in printed
    listed = printed.split("Available subcommands:")[1]
    for name in ("fit", "validate", "test", "predict", "sample"):
        assert f"\n    {name} " in listed, name
    assert " ".join(SAMPLE_HELP.split()[:4]) in " ".join(listed.split())  # sample is described


def test_sample_help_is_samples_own(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sample", "--help"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert printed.startswith("usage: unitok sample")
    assert "--prompt" in printed and "--max_new_tokens" in printed


def test_fit_help_is_unchanged(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--help"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "--trainer" in printed and "--model" in printed
