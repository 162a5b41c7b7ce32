"""The workflow section (asyncrl.workflow.config): bad workflow names are config errors."""

import pytest

from asyncrl import configlib
from asyncrl.config import TrainConfig
from asyncrl.configlib import ConfigError


@pytest.mark.parametrize(
    "name, match",
    [
        ("workflows_for_tests:Nope", "has no 'Nope'"),
        ("no_such_module:Flow", "cannot import module .*searched the working directory .* and the Python path"),
        ("agentic", "neither a registered workflow"),
    ],
)
def test_bad_workflow_names_are_config_errors(name, match):
    with pytest.raises(ConfigError, match=f"workflow.name: .*{match}"):
        configlib.load(TrainConfig, None, [f"workflow.name={name}"])
