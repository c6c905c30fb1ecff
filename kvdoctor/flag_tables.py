"""The README's tables of the CLI's flags (``scripts/update_readme.py``): the flags verbs share and
the old spellings that still work, read from the parsers ``kvdoctor/flags.py`` declares."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from kvdoctor.flags import DEPRECATED_VARIABLES, SHARED, canonical_flag, deprecated_spellings


def verb_parsers(root: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every verb's parser, and its actions' (``rules export``), by their command line."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found[f"{prefix}{name}"] = child
                    walk(child, f"{prefix}{name} ")

    walk(root, "")
    return found


def _flag_actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        flag = canonical_flag(action)
        if flag is not None and not isinstance(action, argparse._SubParsersAction):
            yield flag, action


def shared_table(root: argparse.ArgumentParser) -> str:
    """The README's table of the flags verbs share: flag, variable, the verbs that take it."""
    parsers = verb_parsers(root)
    rows = ["| flag | environment variable | verbs | means |", "|---|---|---|---|"]
    for flag, shared in SHARED.items():
        verbs = [name for name, parser in parsers.items() if any(f == flag for f, _ in _flag_actions(parser))]
        shown = f"`{flag} {shared.metavar}`" if shared.metavar else f"`{flag}`"
        env = f"`{shared.env}`" if shared.env else "none"
        rows.append(f"| {shown} | {env} | {', '.join(verbs)} | {shared.meaning} |")
    return "\n".join(rows)


def deprecated_table(root: argparse.ArgumentParser) -> str:
    """The README's table of the old spellings that still work for one release."""
    rows = ["| old spelling | use | in |", "|---|---|---|"]
    seen: dict[tuple[str, str], list[str]] = {}
    for name, parser in verb_parsers(root).items():
        for _, action in _flag_actions(parser):
            for old, new in deprecated_spellings(action).items():
                seen.setdefault((old, new), []).append(f"`kvdoctor {name}`")
    for old_var, (new_var, verbs) in DEPRECATED_VARIABLES.items():
        seen.setdefault((old_var, new_var), []).extend(f"`kvdoctor {v}`" for v in verbs)
    for (old, new), where in seen.items():
        rows.append(f"| `{old}` | `{new}` | {', '.join(where)} |")
    return "\n".join(rows)
