"""MkDocs hooks (mkdocs.yml ``hooks:``): what the docs site generates at build time.

Two markers, each alone on a line of a page under ``docs/``:

``<!-- lane-cli: lane lanes set -->``
    the reference of that ``lane`` command, rendered from the typer app itself (``lane_plugin.cli.app``): its
    help, usage, arguments and options, as ``lane ... --help`` prints them. Every command of the app must be
    rendered on some page: one that is not fails ``mkdocs build --strict``, naming it, so a new command
    cannot go undocumented.
``<!-- include: tests/faults/README.md -->``
    a markdown file of the repository, its headings one level down, its relative links pointed at the site's
    pages (a page under ``docs/``, or the page that includes the file linked) or, for any other file, shown as
    its path.

Example:
    >>> print(command_reference(["lane", "db", "upgrade"]).splitlines()[0])
    ## `lane db upgrade`
"""

from __future__ import annotations

import html
import logging
import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLI_MARKER = re.compile(r"^<!-- lane-cli: (?P<path>[\w -]+?) -->$", re.M)
INCLUDE_MARKER = re.compile(r"^<!-- include: (?P<path>[\w./-]+) -->$", re.M)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")

log = logging.getLogger("mkdocs.plugins.lane_docs")
_rendered: set[str] = set()
_included_by: dict[str, str] = {}  # repository path of an included file -> the docs page that includes it


def _escape(text: str) -> str:
    """Help text as markdown: no HTML, no emphasis, click's no-rewrap marks (``\\b``) dropped."""
    lines = [line for line in text.splitlines() if line.strip() != "\b"]
    return html.escape("\n".join(lines), quote=False).replace("*", r"\*").replace("_", r"\_")


def _command(path: list[str]) -> tuple[Any, Any]:
    """The click command at ``path`` (``["lane", "lanes", "set"]``) and its context."""
    import typer.main

    from lane_plugin.cli import app

    command = typer.main.get_command(app)
    ctx = command.context_class(command, info_name=path[0])
    for name in path[1:]:
        sub = command.get_command(ctx, name) if hasattr(command, "get_command") else None
        if sub is None:
            raise KeyError(f"no command {' '.join(path)!r}: {name!r} is not a command of {ctx.command_path!r}")
        command, ctx = sub, sub.context_class(sub, info_name=name, parent=ctx)
    return command, ctx


def all_commands(path: list[str] | None = None) -> list[str]:
    """Every command path of the app, groups included: ``["lane", "lane audit", ..., "lane lanes set", ...]``."""
    path = path or ["lane"]
    command, ctx = _command(path)
    out = [" ".join(path)]
    for name in getattr(command, "list_commands", lambda ctx: [])(ctx):
        out += all_commands([*path, name])
    return out


def command_reference(path: list[str], level: int = 2) -> str:
    """One command's reference as markdown, from what its ``--help`` is made of."""
    command, ctx = _command(path)
    parts = [f"{'#' * level} `{' '.join(path)}`", ""]
    if command.help:
        parts += [_escape(command.help), ""]
    parts += ["```console", f"$ {ctx.command_path} {' '.join(command.collect_usage_pieces(ctx))}", "```", ""]
    for kind, title in (("argument", "Arguments"), ("option", "Options")):
        records = [p.get_help_record(ctx) for p in command.get_params(ctx) if p.param_type_name == kind]
        records = [r for r in records if r is not None]
        if records:
            parts += [f"**{title}**:", ""]
            parts += [f"- `{name}`" + (f": {_escape(text)}" if text else "") for name, text in records]
            parts += [""]
    names = getattr(command, "list_commands", lambda ctx: [])(ctx)
    if names:
        parts += ["**Commands**:", ""]
        for name in names:
            sub = command.get_command(ctx, name)
            parts.append(f"- `{name}`: {_escape(sub.get_short_help_str(limit=100))}")
        parts += [""]
    return "\n".join(parts)


def include(repo_path: str, page_uri: str) -> str:
    """A repository file for the page ``page_uri`` (a path under docs/): headings down one level, links fixed."""
    source = ROOT / repo_path
    text = re.sub(r"^(#+) ", r"#\1 ", source.read_text(), flags=re.M)
    page_dir = posixpath.dirname(page_uri)

    def relink(match: re.Match[str]) -> str:
        text, target = match.group("text"), match.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#", target):
            return match.group(0)  # a URL or an anchor of the same page
        file, _, anchor = target.partition("#")
        linked = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), file))
        if linked.startswith("docs/"):
            page = linked.removeprefix("docs/")
        elif linked in _included_by:
            page = _included_by[linked]
        else:
            return text if text.strip("`") == linked else f"{text} (`{linked}`)"
        href = posixpath.relpath(page, page_dir or ".") + (f"#{anchor}" if anchor else "")
        return f"[{text}]({href})"

    return LINK.sub(relink, text)


def on_files(files: Any, config: Any) -> Any:
    """Note which page includes which file before any page is rendered (a link may point at a later page)."""
    _rendered.clear()
    _included_by.clear()
    for file in files.documentation_pages():
        for match in INCLUDE_MARKER.finditer(Path(file.abs_src_path).read_text()):
            _included_by[match.group("path")] = file.src_uri
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def cli(match: re.Match[str]) -> str:
        path = match.group("path").split()
        _rendered.add(" ".join(path))
        return command_reference(path)

    markdown = CLI_MARKER.sub(cli, markdown)
    return INCLUDE_MARKER.sub(lambda m: include(m.group("path"), page.file.src_uri), markdown)


def on_post_build(config: Any) -> None:
    missing = [path for path in all_commands() if path not in _rendered]
    if missing:
        log.warning(
            "the CLI reference leaves out %s: add a '<!-- lane-cli: COMMAND -->' line for each to a page under "
            "docs/reference/cli/",
            ", ".join(missing),
        )
