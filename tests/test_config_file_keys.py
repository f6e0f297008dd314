"""A configuration or policy file's keys are all read or refused: a typo is never a silent default.

`convmem serve --config` and `convmem retention --policy` read TOML or JSON. TOML refuses a table or
key given twice; JSON would keep the last silently, and a key no setting has would leave the setting
it was meant for at its default (a retention policy already refuses one, naming it). Each is exit 5
naming the file and the key, before anything starts or is read from the store.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convmem.adapters import EmbeddedNatsServer
from convmem.adapters.backends.jetstream import JetStreamBackend
from convmem.adapters.frontends.cli._common import CliError
from convmem.adapters.frontends.cli._main import main
from convmem.adapters.frontends.cli._serve import load_config, load_quotas
from convmem.errors import InvalidConfig


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("top.toml", 'stratgy = "truncation"\n', "stratgy"),
        ("nested.toml", "[budget]\nfull_zone_turn = 3\n", "budget.full_zone_turn"),
        ("deeper.json", json.dumps({"health": {"backoff_second": [1]}}), "health.backoff_second"),
        ("table.json", json.dumps({"budget": {"budget": {}}}), "budget.budget"),
    ],
)
def test_a_key_no_setting_has_in_a_serve_config_is_exit_5_naming_it(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CliError) as caught:
        load_config(path)
    assert caught.value.code == 5
    message = str(caught.value)
    assert str(path) in message
    assert f"{where}: is not a setting" in message


def test_a_serve_config_with_its_quotas_table_and_every_known_setting_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        'strategy = "truncation"\n[budget]\nfull_zone_turns = 3\n'
        "[health]\nsummarize_timeout_seconds = 5.0\n"
        '[speaker_names]\nuser = "Ann"\n'
        "[quotas.tenants.acme]\nmax_bytes = 1000\n",
        encoding="utf-8",
    )
    config = load_config(path)
    assert config.budget.full_zone_turns == 3
    assert config.speaker_names == {"user": "Ann"}
    assert load_quotas(path) is not None


@pytest.mark.parametrize(
    ("what", "argv"),
    [
        ("retention policy file", ["-s", "memory://", "retention", "--dry-run", "--policy"]),
        ("config file", None),
    ],
)
def test_a_json_key_given_twice_is_exit_5_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, argv: list[str] | None
) -> None:
    """JSON keeps the last of two equal keys; TOML refuses them: a file means one thing either way."""
    path = tmp_path / "twice.json"
    path.write_text('{"default": {"idle": "1d"}, "budget": {}, "default": {"idle": "2d"}}', encoding="utf-8")
    if argv is None:
        with pytest.raises(CliError) as caught:
            load_config(path)
        message = str(caught.value)
        assert caught.value.code == 5
    else:
        assert main([*argv, str(path)]) == 5
        message = capsys.readouterr().err
    assert f"{what} {path} is not valid JSON" in message
    assert "'default' twice" in message


@pytest.mark.parametrize(
    ("option", "value"), [("stream", "a.b"), ("stream", "a b"), ("bucket", "a.b"), ("journal_bucket", "x y")]
)
def test_a_store_name_nats_would_refuse_is_named_before_anything_is_asked_of_the_server(
    nats_server_shared: EmbeddedNatsServer, option: str, value: str
) -> None:
    """Given from an option or CONVMEM_STREAM: refused naming the setting, not a server 'down or
    overloaded' after the setup's wait, nor its bare 'invalid subject'."""
    with pytest.raises(InvalidConfig) as caught:
        JetStreamBackend.connect(nats_server_shared.url, **{option: value})  # type: ignore[arg-type]
    assert caught.value.field == option
    assert repr(value) in str(caught.value)


@pytest.mark.parametrize("kind", ["directory", "link to /dev/zero", "dangling link"])
def test_a_settings_path_that_is_a_folder_or_a_link_to_no_file_is_exit_5_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Held: a folder, a link to a device, a link to nothing: each one line naming the path (exit 5)."""
    path = tmp_path / "settings.toml"
    if kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero" if kind == "link to /dev/zero" else tmp_path / "nowhere")
    assert main(["-s", "memory://", "retention", "--dry-run", "--policy", str(path)]) == 5
    err = capsys.readouterr().err
    assert f"cannot read retention policy file {path}" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(CliError) as caught:
        load_config(path)
    assert caught.value.code == 5
    assert str(path) in str(caught.value)
