"""deploy.cli's checks that need no stack: the standalone API's token file, exit codes."""
from __future__ import annotations

import pytest

from deploy import cli


def test_a_token_file_others_can_read_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("STATETABLE_API_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    token.chmod(0o644)
    with pytest.raises(SystemExit) as refused:
        cli.api_token(str(token))
    assert "readable by others (mode 644)" in str(refused.value) and "chmod 600" in str(refused.value)
    assert "s3cret" not in str(refused.value)
    token.chmod(0o600)
    assert cli.api_token(str(token)) == "s3cret-token-value"


def test_a_request_statetable_refuses_exits_2_and_a_failure_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STATETABLE_TABLES_DIR", str(tmp_path))
    assert cli.main(["tables", "nosuch"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("statetable tables: no table 'nosuch'") and "Error" not in err[0]
    assert cli.main(["drill", "t", "--failure", "meteor"]) == cli.EXIT_USAGE
    assert "is not a drill" in capsys.readouterr().err
