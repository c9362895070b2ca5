"""A settings error is one line naming the variable, worded once for `amc cloud serve` and every
other `amc` command (`cloud.settings.validation_problem`), and never quoting a secret."""

from __future__ import annotations

import pytest
from pydantic import AliasChoices, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from cloud import startup
from console import cli_errors


class VaultSettings(BaseSettings):
    """A part's settings whose secrets are checked, as any part's may be one day."""

    model_config = SettingsConfigDict(env_prefix="AMC_VAULT_", extra="ignore")

    api_token: SecretStr | None = Field(default=None, min_length=16)
    admin_password: str = Field(default="", max_length=8)
    max_tokens: int = Field(default=64, ge=64)
    signing_key: SecretStr | None = Field(
        default=None,
        min_length=16,
        validation_alias=AliasChoices("AMC_VAULT_SIGNING_KEY", "VAULT_SIGNING_KEY"),
    )


def _refusal() -> ValidationError:
    with pytest.raises(ValidationError) as refused:
        VaultSettings()
    return refused.value


@pytest.mark.parametrize(
    ("variable", "named", "value", "shown"),
    [
        ("AMC_VAULT_API_TOKEN", "AMC_VAULT_API_TOKEN", "hunter2-short", False),
        ("AMC_VAULT_ADMIN_PASSWORD", "AMC_VAULT_ADMIN_PASSWORD", "correct-horse", False),
        ("AMC_VAULT_MAX_TOKENS", "AMC_VAULT_MAX_TOKENS", "12", True),
        # a field read under aliases is named by its first (pydantic's loc), prefixed no more
        ("VAULT_SIGNING_KEY", "AMC_VAULT_SIGNING_KEY", "abc123-short", False),
    ],
)
def test_a_settings_error_names_the_variable_and_never_quotes_a_secret(
    monkeypatch: pytest.MonkeyPatch, variable: str, named: str, value: str, shown: bool
) -> None:
    """Both copies of this wording echoed `(got '<value>')` whatever the field held, each with
    a prefix table kept by hand (a class missing from it lost its prefix): a check on a secret
    field that failed printed the secret to the terminal and into whatever keeps its output.
    The prefix now comes from the class; a SecretStr, or a field named *key*, *token*,
    *password* or *secret*, is named without its value; a field read under its aliases (as the
    planner's API keys are) is named by the alias, not with the prefix before it again."""
    monkeypatch.setenv(variable, value)
    refusal = _refusal()
    cloud_line = startup.explain(refusal) or ""
    cli = cli_errors.explain(refusal)
    assert cli is not None
    for line in (cloud_line, cli.message):
        assert (value in line) is shown, line
        assert (f"(got {value!r})" in line) is shown, line
        assert line.startswith(f"{named}: "), line
    assert cloud_line.startswith(cli.message + "; " + cli.hint), (cloud_line, cli)


@pytest.mark.parametrize("debug", [False, True])
def test_an_amc_error_line_never_quotes_a_configured_secret(
    capsys: pytest.CaptureFixture[str], debug: bool
) -> None:
    """`amc`'s one line (and its --debug traceback) printed the exception's text as it came:
    a library that quoted the console's password, or the database URL's, put it on the
    terminal and into whatever keeps its output. Scrubbed as log lines are."""
    from console.settings import ConsoleSettings

    password = "correct-horse-staple-42"
    ConsoleSettings(admin_password=SecretStr(password))

    def main() -> None:
        raise RuntimeError(f"form rejected: password={password} url=postgresql://amc:pw9@db/amc")

    code = cli_errors.run_main(main, ["console", "serve"], debug=lambda: debug, groups={"console"})
    said = capsys.readouterr().err
    assert code != 0
    assert "form rejected" in said and "amc console serve: unexpected RuntimeError" in said
    assert password not in said and "pw9" not in said, said
