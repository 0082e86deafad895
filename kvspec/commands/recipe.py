"""``kvspec recipe``: the CI recipes (GitHub Actions, Buildkite), printed
ready to commit into a vLLM checkout."""

from __future__ import annotations

import argparse
from importlib import resources

from kvspec.model.outcome import Outcome

RECIPES = {"github-actions": "github-actions.yml", "buildkite": "buildkite.yml"}
SOURCE_PLACEHOLDER = "kvspec @ git+https://github.com/OWNER/kvspec@TAG"


def recipe_text(name: str, source: str | None = None) -> str:
    text = resources.files("kvspec.recipes").joinpath(RECIPES[name]).read_text(encoding="utf-8")
    return text.replace(SOURCE_PLACEHOLDER, source) if source else text


HELP = "print a CI recipe (GitHub Actions workflow, Buildkite step)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(RECIPES))
    parser.add_argument("--source", metavar="PIP-SPEC",
                        help=f"what the job pip-installs as kvspec (replaces {SOURCE_PLACEHOLDER!r})")


def run(args: argparse.Namespace) -> Outcome:
    print(recipe_text(args.name, args.source), end="")
    return Outcome.OK
