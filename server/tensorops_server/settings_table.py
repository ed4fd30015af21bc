"""README's table of the server's settings, made from their declaration (the fields of
config.Config). `python -m tensorops_server.settings_table` prints it; a test fails while
README's copy differs."""

from __future__ import annotations

import re
import sys
from dataclasses import fields

from .config import Config, env_name, flag_name, parse_of, shown_default


def _cell(text: str) -> str:
    text = re.sub(r"\bdocs/[\w.-]+\.md\b", lambda m: f"[{m[0]}]({m[0]})", text)  # links, as elsewhere in README
    return text.replace("|", "\\|")


def markdown() -> str:
    """The settings table in Markdown, one row per setting in declaration order."""
    rows = ["| flag | variable | value | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields(Config):
        parse = parse_of(f)
        value = re.sub(r"^an? ", "", parse.expects) + (f", {parse.unit}" if parse.unit else "")
        rows.append(
            f"| `{flag_name(f.name)}` | `{env_name(f.name)}` | {_cell(value)} | {_cell(shown_default(f))} "
            f"| {_cell(f.metadata['help'])} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
