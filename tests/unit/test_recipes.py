"""The CI recipes are valid, run one and the same kvspec command (which the
command line accepts), and upload or annotate what that command writes."""

from __future__ import annotations

import shlex

import pytest
import yaml

from kvspec.cli import build_parser
from kvspec.commands.recipe import RECIPES, SOURCE_PLACEHOLDER, recipe_text

from tests.support import check_command


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_is_valid_yaml_and_its_command_parses(name):
    doc = yaml.safe_load(recipe_text(name))
    assert doc
    args = build_parser().parse_args(shlex.split(check_command(name))[1:])
    assert args.vllm_src == "." and args.out == "kvspec-results" and args.jobs >= 1


def test_both_recipes_run_the_same_command():
    assert check_command("github-actions") == check_command("buildkite")


def test_github_workflow_posts_and_uploads_what_check_writes():
    doc = yaml.safe_load(recipe_text("github-actions"))
    steps = doc["jobs"]["kvspec"]["steps"]
    text = " ".join(str(s.get("run", "")) + str(s.get("with", "")) for s in steps)
    assert "--body-file kvspec-results/report.md" in text
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert "kvspec-results/" in upload["with"]["path"] and upload["if"] == "always()"
    (cache,) = [s for s in steps if str(s.get("uses", "")).startswith("actions/cache")]
    assert "~/.cache/kvspec" in cache["with"]["path"] and ".kvspec/examples" in cache["with"]["path"]


def test_buildkite_step_annotates_and_keeps_the_exit_code():
    (step,) = yaml.safe_load(recipe_text("buildkite"))["steps"]
    assert "buildkite-agent annotate" in step["command"] and "kvspec-results/report.md" in step["command"]
    assert step["command"].rstrip().endswith('exit "$$status"')
    assert "kvspec-results/*" in step["artifact_paths"]


def test_source_is_substituted():
    for name in RECIPES:
        assert SOURCE_PLACEHOLDER in recipe_text(name)
        text = recipe_text(name, "kvspec==0.1.0")
        assert SOURCE_PLACEHOLDER not in text and '"kvspec==0.1.0"' in text
