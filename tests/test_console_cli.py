"""The console's command-line entry points: bare `courier`, `courier console`, their errors."""

from __future__ import annotations

from click.testing import CliRunner

from console.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help_still_lists_the_commands_and_the_console():
    result = run("--help")
    assert result.exit_code == 0
    assert "console" in result.output and "demo" in result.output
    assert "With no command, opens the operator console" in result.output


def test_bare_courier_with_an_unreachable_database_is_one_line_and_exit_1():
    result = run("--dsn", "postgresql://nobody@127.0.0.1:1/nothing")
    assert result.exit_code == 1
    assert result.output.count("\n") <= 2 and "cannot connect" in result.output
    assert "Traceback" not in result.output


def test_console_on_a_database_without_the_schema_says_to_migrate(empty_dsn):
    result = run("console", "--dsn", empty_dsn)
    assert result.exit_code == 1
    assert "courier migrate" in result.output


def test_console_rejects_a_negative_pool_size():
    result = run("console", "--workers", "-1")
    assert result.exit_code == 2
    assert "--workers" in result.output


def test_console_without_a_terminal_says_what_to_use_instead(dsn):
    result = run("console", "--dsn", dsn)
    assert result.exit_code == 2
    assert "needs a terminal" in result.output
