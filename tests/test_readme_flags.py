"""The README's `toolkit serve` flags table agrees with the flags `ServerArgs` declares: every flag in its `--help`
group's row, no flag the parser does not know, and the choices it shows are the ones argparse accepts."""
from __future__ import annotations

import re
from pathlib import Path

from toolkit.runtime.server_args import build_parser, flag_fields

README = Path(__file__).resolve().parents[1] / "README.md"
CELL_SPLIT = re.compile(r"(?<!\\)\|")  # a table cell ends at an unescaped pipe
FLAG_IN_CODE = re.compile(r"`(--[a-z0-9-]+)")
FLAG_WITH_VALUES = re.compile(r"`(--[a-z0-9-]+) ([^`]+)`")


def readme_rows() -> dict[str, str]:
    """Group name → its flags cell, from the `| group | flags |` table of the `toolkit serve` section."""
    section = README.read_text().split("### `toolkit serve`", 1)[1].split("\n### ", 1)[0]
    lines = section.splitlines()
    start = lines.index("| group | flags |") + 2  # NOTE: skips the header's `|---|---|` line
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        _, group, flags, _ = CELL_SPLIT.split(line)
        rows[group.strip()] = flags
    return rows


def parser_groups() -> dict[str, list[list[str]]]:
    """`--help` group title → each of its flags' option strings (the first one the canonical name)."""
    titles = {spec.group for _, spec in flag_fields()}
    return {group.title: [action.option_strings for action in group._group_actions]
            for group in build_parser()._action_groups if group.title in titles}


def readme_row_of(title: str, rows: dict[str, str]) -> str:
    """The README names a group by the first words of its `--help` title ("Kernels" for "Kernels and
    optimizations")."""
    matches = [cell for name, cell in rows.items() if title.startswith(name)]
    assert len(matches) == 1, f"the README table has no single row for the group {title!r}"
    return matches[0]


def test_every_flag_is_in_its_groups_row_of_the_readme():
    rows = readme_rows()
    for title, actions in parser_groups().items():
        shown = set(FLAG_IN_CODE.findall(readme_row_of(title, rows)))
        missing = [options[0] for options in actions if options[0] not in shown]
        assert not missing, f"README's {title!r} row lacks {missing}"


def test_every_flag_in_the_readme_exists_in_its_group():
    rows = readme_rows()
    groups = parser_groups()
    assert len(rows) == len(groups), f"README groups {sorted(rows)} vs --help groups {sorted(groups)}"
    for title, actions in groups.items():
        known = {option for options in actions for option in options}  # aliases (`--tp`) count
        unknown = set(FLAG_IN_CODE.findall(readme_row_of(title, rows))) - known
        assert not unknown, f"README's {title!r} row names flags `toolkit serve` does not have: {sorted(unknown)}"


def test_the_choices_the_readme_shows_are_the_ones_accepted():
    choices = {option: tuple(action.choices) for action in build_parser()._actions if action.choices
               for option in action.option_strings}
    shown = [match for cell in readme_rows().values() for match in FLAG_WITH_VALUES.findall(cell)]
    assert shown, "the README table shows no choices"
    for option, values in shown:
        assert tuple(values.split("\\|")) == choices.get(option), f"README's {option} {values} vs argparse"
