"""Docstrings of Python source: what each definition says it does (the labelled text of
`tasks.data.labelled_text`), a key that finds a docstring's repeats, and copies of source files
with chosen docstrings cut out — so that a pretraining corpus can cover the fine-tuning domain
(the packages' code) without holding any of its labelled examples.
"""

from __future__ import annotations

import ast
import hashlib
import io
import os
import re
import sysconfig
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Docstring:
    """One documented definition: its first paragraph, top-level package, module and first line."""

    text: str
    package: str
    module: str
    signature: str
    name: str


def source_lines(source: str, keepends: bool = False) -> list[str]:
    """``source``'s lines as Python (ast, tokenize) numbers them: ended by \\n, \\r\\n or \\r only,
    where ``str.splitlines`` also ends one at \\f, \\v, \\x1c–\\x1e, \\x85, \\u2028 and \\u2029."""
    lines = io.StringIO(source, newline="").readlines()
    return lines if keepends else [line.rstrip("\r\n") for line in lines]


def package_of(path: Path, root: Path = STDLIB) -> tuple[str, str]:
    """(top-level package, dotted module) of a source file under ``root``."""
    parts = path.relative_to(root).with_suffix("").parts
    return parts[0], ".".join(p for p in parts if p != "__init__")


def first_paragraph(doc: str, max_chars: int = 500) -> str:
    """A docstring's first paragraph on one line (whitespace runs become one space), cut at ``max_chars``."""
    return " ".join(doc.split("\n\n")[0].split())[:max_chars]


def docstring_key(text: str) -> str:
    """What makes two texts the same docstring: their casefolded words, one space apart
    (whitespace, line breaks, case and punctuation aside)."""
    return " ".join(_WORD.findall(text.casefold()))


def extract_docstrings(files: Sequence[Path], min_chars: int = 30, max_chars: int = 500) -> list[Docstring]:
    """Docstrings (first paragraph) of every function and class in ``files`` (standard-library
    files), with their package, module and ``def`` / ``class`` line."""
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source_lines(source)
        package, module = package_of(path)
        for node in ast.walk(tree):
            if not isinstance(node, _DEFINITIONS):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            text = first_paragraph(doc, max_chars)
            if len(text) >= min_chars:
                found.append(Docstring(text, package, module, lines[node.lineno - 1].strip(), node.name))
    return found


def _docstring_nodes(tree: ast.Module) -> Iterable[ast.Expr]:
    """The docstring statements of a module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, *_DEFINITIONS)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first


def strip_docstrings(source: str, keys: Iterable[str]) -> str:
    """``source`` with every docstring (module, class or function) whose `docstring_key`
    contains one of ``keys`` replaced by ``...`` (the code stays valid Python), and every such
    comment by ``#``. Source that does not parse is returned as it is."""
    keys = [k for k in keys if k]
    try:
        tree = ast.parse(source)
        readline = io.StringIO(source, newline="").readline  # the rows of `source_lines`, as ast counts them
        comments = [t for t in tokenize.generate_tokens(readline) if t.type == tokenize.COMMENT]
    except (SyntaxError, tokenize.TokenError):
        return source
    lines = source_lines(source, keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, byte_col: int) -> int:  # ast: 1-based rows, UTF-8 byte columns -> character offset
        return starts[row - 1] + len(lines[row - 1].encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def holds_key(text: str) -> bool:
        text = docstring_key(text)
        return any(k in text for k in keys)

    spans = []
    for node in _docstring_nodes(tree):
        if holds_key(node.value.value):  # type: ignore[attr-defined]
            spans.append((offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset), "..."))
    for tok in comments:  # tokenize: character columns
        if holds_key(tok.string):
            spans.append((starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1], "#"))
    for begin, end, replacement in sorted(spans, reverse=True):
        source = source[:begin] + replacement + source[end:]
    return source


def without_docstrings(files: Sequence[Path], keys: Iterable[str], cache_dir: Path) -> list[Path]:
    """``files`` with the docstrings that contain any of ``keys`` (`strip_docstrings`) cut out:
    a file that loses one is replaced by its copy under ``cache_dir`` (written once, keyed by
    the files and the keys); the others are returned as they are, in the same order."""
    keys = sorted(set(keys))
    h = hashlib.sha1("\n".join(keys).encode())
    for f in files:
        stat = f.stat()
        h.update(f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    folder = cache_dir / f"without-docstrings-{h.hexdigest()[:16]}"
    listing = folder / "files.txt"
    if listing.is_file():
        return [Path(line) for line in listing.read_text().splitlines()]
    folder.mkdir(parents=True, exist_ok=True)
    result = []
    for i, path in enumerate(files):
        source = path.read_text(encoding="utf-8", errors="replace")
        stripped = strip_docstrings(source, keys)
        if stripped == source:
            result.append(path)
            continue
        copy = folder / f"{i:05d}-{path.name}"
        tmp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")  # several processes may build it
        tmp.write_text(stripped, encoding="utf-8")
        tmp.replace(copy)
        result.append(copy)
    tmp = listing.with_name(f"files.txt.{os.getpid()}.tmp")  # written last: its presence means complete
    tmp.write_text("\n".join(str(p) for p in result))
    tmp.replace(listing)
    return result
