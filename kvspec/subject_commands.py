"""Subcommands that drive a real vLLM (fuzz, mutants, check): registered here
so the CLI stays thin and ``kvspec prove`` never imports the subject side."""

from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction") -> None:
    return None
