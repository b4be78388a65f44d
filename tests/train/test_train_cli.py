"""`dit train --help`: the model families' options are laid out like argparse's own."""

import pytest

from dit_trainer.cli import main
from dit_trainer.config.doc import family_docs


def test_family_options_have_help_and_a_gap(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for _, docs in family_docs():
        for d in docs:
            option = f"  --{d.key} {d.type.split()[0].upper()}"
            after = text[text.index(option + " ") if option + " " in text else text.index(option + "\n"):]
            after = after[len(option):]
            # A gap after the metavar (was `FLOATeps of ...`), then a description before the type.
            assert after[0] in " \n" and not after.strip().startswith("["), option
