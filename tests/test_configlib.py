"""The config machinery (asyncrl.configlib): YAML then overrides; unknown keys named with file, line and the nearest
key; wrong types; describe and dump; and the mistakes that used to pass silently or end in a traceback: non-finite
floats, duplicate YAML keys, several-line YAML errors, a config path that is a directory, unreadable or not UTF-8."""

import dataclasses
import math
import typing
from pathlib import Path

import pytest

from asyncrl import configlib
from asyncrl.config import EvalConfig, RMConfig, SFTConfig, TrainConfig
from asyncrl.configlib import ConfigError


def _yaml(tmp_path, text: str | bytes, name="c.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _float_keys(cls, prefix=""):
    """Every dotted key of ``cls`` typed float or float | None."""
    for f in dataclasses.fields(cls):
        typ = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(typ):
            yield from _float_keys(typ, prefix + f.name + ".")
        elif typ is float or float in typing.get_args(typ):
            yield prefix + f.name


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig, EvalConfig])
def test_every_float_key_refuses_nan_and_inf(cls):
    keys = list(_float_keys(cls))
    assert len(keys) > (20 if cls is TrainConfig else 1)
    values = [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf"), ("nan", "nan"), ("Infinity", "inf")]
    for i, key in enumerate(keys):  # one spelling per key, in turn (YAML's .nan, and strings that float() reads)
        raw, shown = values[i % len(values)]
        with pytest.raises(ConfigError) as e:
            configlib.load(cls, None, [f"{key}={raw}"])
        assert str(e.value) == f"command line: '{key}' must be a finite number, got {shown}"


@pytest.mark.parametrize(
    "override",
    [
        "actor.lr=.inf",
        "gconfig.temperature=.nan",
        "reward.timeout_s=.nan",
        "max_train_time_s=.nan",
        "actor.c_clip=.inf",
        "actor.eps_clip_higher=nan",
    ],
)
def test_reported_non_finite_overrides(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^command line: '{key}' must be a finite number, got (nan|inf)$"):
        configlib.load(TrainConfig, None, [override])


def test_non_finite_floats_in_a_yaml_file_name_the_line(tmp_path):
    path = _yaml(tmp_path, "actor:\n  eps_clip: 0.2\n  lr: 'nan'\ngconfig:\n  temperature: .inf\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: 'actor.lr' must be a finite number, got nan$"):
        configlib.load(TrainConfig, path)
    with pytest.raises(ConfigError, match="'actor.lr' must be a finite number, got inf"):
        configlib.load(TrainConfig, None, ["actor.lr=" + "9" * 400])  # an int too large for a float


def test_finite_floats_still_load(tmp_path):
    path = _yaml(tmp_path, "actor:\n  lr: 3e-4\n  c_clip: null\ngconfig:\n  temperature: 1\n")
    cfg = configlib.load(TrainConfig, path, ["actor.eps_clip=0.25"])
    assert cfg.actor.lr == 3e-4 and cfg.actor.c_clip is None and cfg.gconfig.temperature == 1.0
    assert isinstance(cfg.gconfig.temperature, float) and math.isfinite(cfg.actor.eps_clip)
    with pytest.raises(ConfigError, match="'actor.lr' must be float, got True"):
        configlib.load(TrainConfig, None, ["actor.lr=true"])


@pytest.mark.parametrize(
    "text,line,key,first",
    [
        ("actor:\n  lr: 1.0e-5\n  eps_clip: 0.2\n\n  # later\n\n  lr: 3.0e-4\n", 7, "actor.lr", 2),
        ("gconfig:\n  n_samples: 4\nactor:\n  lr: 1.0e-5\ngconfig:\n  top_k: 3\n", 5, "gconfig", 1),
        ("reward:\n  kwargs:\n    mode: fraction\n    mode: all\n", 4, "reward.kwargs.mode", 3),
        ("actor: {lr: 1.0e-5, lr: 2.0e-5}\n", 1, "actor.lr", 1),
        ("seed: 1\nseed: 2\n", 2, "seed", 1),
        ("reward:\n  kwargs:\n    cases:\n      - {a: 1, a: 2}\n", 4, "reward.kwargs.cases[0].a", 4),
    ],
)
def test_duplicate_yaml_keys_are_errors_naming_both_lines(tmp_path, text, line, key, first):
    path = _yaml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        configlib.load(TrainConfig, path)
    assert str(e.value) == f"{path}:{line}: duplicate key '{key}' (first at line {first})"


def test_same_name_in_different_sections_and_merge_keys_are_not_duplicates(tmp_path):
    path = _yaml(
        tmp_path, "seed: 3\ntrain_dataset:\n  seed: 4\nactor:\n  <<: {lr: 1.0e-5, eps_clip: 0.3}\n  lr: 2.0e-5\n"
    )
    cfg = configlib.load(TrainConfig, path)
    assert (cfg.seed, cfg.train_dataset.seed, cfg.actor.lr, cfg.actor.eps_clip) == (3, 4, 2e-5, 0.3)


@pytest.mark.parametrize(
    "text,where,problem",
    [
        (
            "actor:\n  lr: [1, 2\n",
            ":3:1:",
            "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence at line 2, column 7)",
        ),
        ("actor:\n\tlr: 1\n", ":2:1:", "found character '\\t' that cannot start any token"),
        ("actor:\n  lr: 1\n bad: 2\n", ":3:2:", "expected <block end>, but found '<block mapping start>'"),
    ],
)
def test_yaml_syntax_error_is_one_line_with_line_and_column(tmp_path, text, where, problem):
    path = _yaml(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        configlib.load(TrainConfig, path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}{where} not valid YAML: ") and problem in msg


def test_an_override_keeps_a_hash_after_a_space():
    """A command line holds no YAML comment: a template's ' #...' was cut off without a word."""
    cfg = configlib.load(
        TrainConfig,
        None,
        ["train_dataset.prompt_template=Solve {question} #show your work", 'experiment_name="a #b"', "actor.lr=1e-5"],
    )
    assert cfg.train_dataset.prompt_template == "Solve {question} #show your work"
    assert cfg.experiment_name == "a #b" and cfg.actor.lr == 1e-5


def test_override_value_that_is_not_yaml_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        configlib.load(TrainConfig, None, ["actor.lr=[1"])
    assert str(e.value).startswith("command line: override 'actor.lr=[1': not valid YAML: expected ',' or ']'")
    assert "\n" not in str(e.value)


def test_config_path_that_is_a_directory(tmp_path):
    with pytest.raises(ConfigError, match=rf"^config file '{tmp_path}' is a directory; give a YAML file$"):
        configlib.load(TrainConfig, str(tmp_path))


def test_config_file_that_is_not_utf8_names_the_line(tmp_path):
    path = _yaml(tmp_path, b"gconfig:\n  n_samples: 4 # caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: not UTF-8 text \(byte 0xe9: invalid continuation byte\)$"):
        configlib.load(TrainConfig, path)


def test_config_file_with_a_byte_order_mark_loads(tmp_path):
    path = _yaml(tmp_path, b"\xef\xbb\xbfgconfig:\n  n_samples: 4\n")
    assert configlib.load(TrainConfig, path).gconfig.n_samples == 4


def test_unreadable_config_file(tmp_path, monkeypatch):
    path = _yaml(tmp_path, "seed: 2\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match=rf"^config file '{path}' cannot be read: Permission denied$"):
        configlib.load(TrainConfig, path)


def test_yaml_then_overrides(tmp_path):
    path = _yaml(tmp_path, "gconfig:\n  n_samples: 4\nactor:\n  lr: 1.0e-5\n")
    cfg = configlib.load(TrainConfig, path, ["actor.lr=3e-4", "rollout.max_head_offpolicyness=0"])
    assert cfg.gconfig.n_samples == 4 and cfg.actor.lr == 3e-4 and cfg.rollout.max_head_offpolicyness == 0


def test_unknown_key_names_file_line_and_nearest_key(tmp_path):
    path = _yaml(tmp_path, "gconfig:\n  n_samples: 4\n  temprature: 0.7\n")
    with pytest.raises(ConfigError) as e:
        configlib.load(TrainConfig, path)
    msg = str(e.value)
    assert f"{path}:3" in msg and "gconfig.temprature" in msg and "gconfig.temperature" in msg


def test_unknown_override_suggests_key():
    with pytest.raises(ConfigError, match="rollout.max_head_offpolicyness"):
        configlib.load(TrainConfig, None, ["rollout.max_head_offpolicy=2"])


def test_wrong_type_names_key_and_source(tmp_path):
    path = _yaml(tmp_path, "train_dataset:\n  batch_size: many\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2.*train_dataset.batch_size.*int"):
        configlib.load(TrainConfig, path)
    with pytest.raises(ConfigError, match="command line.*actor.lr"):
        configlib.load(TrainConfig, None, ["actor.lr=fast"])
    with pytest.raises(ConfigError, match="progress_bar.*bool"):
        configlib.load(TrainConfig, None, ["progress_bar=3"])


def test_section_given_a_scalar(tmp_path):
    with pytest.raises(ConfigError, match="'actor' is a section"):
        configlib.load(TrainConfig, _yaml(tmp_path, "actor: 3\n"))


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match="key.sub=value"):
        configlib.load(TrainConfig, None, ["actor.lr"])
    with pytest.raises(ConfigError, match="does not exist"):
        configlib.load(TrainConfig, "/nonexistent.yaml")


def test_describe_documents_every_key():
    text = configlib.describe(TrainConfig)
    for key in configlib.all_keys(TrainConfig):
        assert key in text
    assert "max staleness" in text


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig, EvalConfig, RMConfig])
def test_describe_shows_each_commands_own_defaults(cls):
    """A command may set a section's defaults its own way (asyncrl sft: actor.lr 2e-5, batch_size 64): the
    help shows those, not the section class's."""
    shown = dict(
        line.split(" = ", 1)
        for line in configlib.describe(cls).splitlines()
        if " = " in line and not line.startswith(" ")
    )
    default = cls()
    for key in configlib.all_keys(cls):
        value = default
        for part in key.split("."):
            value = getattr(value, part)
        assert shown[key].rsplit("  (", 1)[0] == repr(value), key


def test_every_commands_default_model_is_shipped():
    from asyncrl.models.hf import resolve_model_path

    for cls in (TrainConfig, SFTConfig, EvalConfig, RMConfig):
        assert Path(resolve_model_path(cls().model.path)).is_dir(), cls.__name__


def test_dump_round_trips(tmp_path):
    cfg = configlib.load(TrainConfig, None, ["gconfig.temperature=0.8"])
    configlib.dump(cfg, tmp_path / "out.yaml")
    again = configlib.load(TrainConfig, str(tmp_path / "out.yaml"))
    assert again == cfg


def test_secrets_are_never_written_to_a_config_file(tmp_path):
    """agent.admin_key (and any *api_key) is dumped as *** (the run directory's config.yaml); the run's own
    processes get it unmasked."""
    cfg = configlib.load(TrainConfig, None, ["agent.admin_key=s3cret"])
    configlib.dump(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "s3cret" not in text and "admin_key: '***'" in text
    configlib.dump(cfg, tmp_path / "ranks.yaml", mask_secrets=False)
    assert "s3cret" in (tmp_path / "ranks.yaml").read_text()


def test_dump_replaces_the_file_whole(tmp_path, monkeypatch):
    """config.yaml is written at every start of a run: a kill in the middle left it torn, and the resume refused
    the run ("cannot read ... set resume=fresh"). It is written aside and renamed into place."""
    import os

    from asyncrl.config import TrainConfig

    path = tmp_path / "config.yaml"
    configlib.dump(configlib.load(TrainConfig, None, ["total_train_steps=7"]), path)
    before = path.read_text()

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        configlib.dump(configlib.load(TrainConfig, None, ["total_train_steps=9"]), path)
    assert path.read_text() == before
