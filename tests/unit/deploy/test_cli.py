"""deploy.cli's checks that need no stack: the standalone API's token file, exit codes."""
from __future__ import annotations

import re

import pytest

from catalog.errors import UserError
from deploy import cli


def test_a_token_file_others_can_read_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("STATETABLE_API_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    token.chmod(0o644)
    with pytest.raises(UserError) as refused:
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


GOOD = """-- topic: page-views
-- schema: page STRING, ms BIGINT
-- partitions: 2
CREATE TABLE page_views AS SELECT page, SUM(ms) AS total_ms FROM page_views GROUP BY page;
"""
BROKEN = "-- topic: b\n-- schema: k STRING, v BIGINT\nCREATE TABLE broken AS SELECT k, MEDIAN(v) AS m FROM s GROUP BY k"


@pytest.mark.parametrize("argv", [
    ["tables", "nosuch"], ["run", "nosuch"], ["run", "broken"], ["restore", "nosuch"], ["verify", "nosuch"],
    ["rebuild", "nosuch"], ["query", "nosuch", "k"], ["create-topic", "nosuch"], ["create-topic", "broken"],
    ["produce", "nosuch"], ["dead-letters", "nosuch"], ["accept-offsets", "nosuch"],
    ["drill", "page_views", "--failure", "meteor"], ["serve", "--readers", "1"], ["stack", "wipe-workers"],
    ["produce", "page_views", "/no/such/file.jsonl"], ["restore", "broken"],
])
def test_every_mistake_a_user_can_type_is_one_line_without_a_python_class_name(argv, tmp_path, monkeypatch, capsys):
    """Mistakes in the request (an unknown or refused table, a bad option, a missing file) end
    with exit 2 and one line naming the command: no traceback, no `ValueError:`."""
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "page_views.sql").write_text(GOOD)
    (tables / "broken.sql").write_text(BROKEN)
    monkeypatch.setenv("STATETABLE_TABLES_DIR", str(tables))
    monkeypatch.setenv("STATETABLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("STATETABLE_API_TOKEN", "t" * 32)
    monkeypatch.setenv("STATETABLE_KAFKA_BOOTSTRAP", "127.0.0.1:1")      # nothing a mistake should reach
    monkeypatch.delenv("STATETABLE_DEBUG", raising=False)
    code = cli.main(argv)
    out = capsys.readouterr()
    lines = [line for line in out.err.splitlines() if line.strip()]
    assert code == cli.EXIT_USAGE, (argv, code, out.err)
    assert len(lines) == 1 and lines[0].startswith(("statetable ", "stack ")), (argv, out.err)
    assert not re.search(r"\b[A-Z]\w*(Error|Exception):", lines[0]) and "Traceback" not in out.err, lines[0]


@pytest.mark.parametrize("setting, value, argv, names", [
    ("STATETABLE_KAFKA_CONFIG", "/no/such/client.properties", ["create-topic", "page_views"], "no such file"),
    ("STATETABLE_KAFKA_CONFIG", "{tmp}/bad.properties", ["create-topic", "page_views"], "line 1 is not `name=value`"),
    ("STATETABLE_LOCK_WAIT_SECONDS", "60", ["rebuild", "page_views"], "no committed batch to rebuild from"),
    ("STATETABLE_SPARK_CONF", "spark.sql.ansi.enabled=true", ["verify", "page_views"],
     "STATETABLE_SPARK_CONF: spark.sql.ansi.enabled is statetable's to set"),
])
def test_a_wrong_setting_or_a_refused_request_is_one_line_and_exits_2(setting, value, argv, names, tmp_path,
                                                                      monkeypatch, capsys):
    """A setting a user gave wrong (state.errors.BadSetting) and a request the table's state
    refuses (catalog.errors.UserError) are mistakes of the request, as a wrong argument is:
    exit 2, one line naming what to fix."""
    tables = tmp_path / "tables"
    tables.mkdir()
    (tables / "page_views.sql").write_text(GOOD)
    monkeypatch.setenv("STATETABLE_TABLES_DIR", str(tables))
    monkeypatch.setenv("STATETABLE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("STATETABLE_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol\n")
    bad.chmod(0o600)
    monkeypatch.setenv(setting, value.format(tmp=tmp_path))
    monkeypatch.delenv("STATETABLE_DEBUG", raising=False)
    code = cli.main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == cli.EXIT_USAGE and len(lines) == 1 and names in lines[0], (code, lines)
    assert not re.search(r"\b[A-Z]\w*(Error|Exception):", lines[0]), lines[0]
