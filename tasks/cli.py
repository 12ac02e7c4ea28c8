"""The `unitok` command: a LightningCLI (fit / validate / test / predict) plus `unitok sample`.

Every run is a YAML recipe in ``configs/<family>/<recipe>.yaml``; model and data are chosen
by ``class_path`` (subclass mode), and the data module's vocabulary size, EOS id and context
length flow into the model through ``link_arguments``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.cli import LightningCLI


class UnitokCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.init_args.context_length", "model.init_args.context_length")
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.eos_token_id", "model.init_args.eos_token_id", apply_on="instantiate")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "sample":
        from tasks.sample import main as sample_main

        sample_main(args[1:])
        return
    UnitokCLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        args=args if argv is not None else None,
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    main()
