"""Run directories without the paths of the machine that wrote them.

A run records what ran: command lines, data files, logs with tracebacks, the native build's cache
directory. On the machine that ran it these are absolute paths (the checkout, the Python
environment, the home and temporary directories), which say nothing to a reader of committed
results and differ between two machines running the same command. Before a run directory is
committed (scripts/gpu_suite.py does this for every stage), those prefixes are rewritten: the
checkout to paths relative to it, the others to the placeholders `<env>`, `~` and `<tmp>`. Only the
prefixes change; every number and every other byte stays as written.
"""

from __future__ import annotations

import gzip
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# a prefix is a whole path: it starts where a path does (not inside another one) and ends at "/"
# or at a character that cannot continue a path name
_START = r"(?<![\w./-])"
_END = r"(?![\w.-])"


def machine_prefixes(checkout: Path) -> dict[str, str]:
    """This machine's prefixes and what each becomes: the checkout "" (relative paths; "." where
    the checkout itself is named), the Python environment `<env>`, home `~`, the temp dir `<tmp>`."""
    return {str(checkout.resolve()): "", sys.prefix: "<env>", str(Path.home()): "~",
            tempfile.gettempdir(): "<tmp>"}


def portable_text(text: str, prefixes: Mapping[str, str]) -> str:
    """`text` with each prefix replaced, the longest first (a checkout inside home stays relative).
    An empty replacement makes `prefix/x` into `x` and a bare `prefix` into `.`. The root "/" (a
    home directory can be it) is no prefix: it would rewrite every path."""
    for prefix, new in sorted(prefixes.items(), key=lambda item: len(item[0]), reverse=True):
        escaped = re.escape(prefix.rstrip("/"))
        if not escaped:
            continue
        if not new:
            text = re.sub(_START + escaped + "/", "", text)
        text = re.sub(_START + escaped + _END, lambda _, rep=new or ".": rep, text)  # taken literally
    return text


def make_portable(root: Path, prefixes: Mapping[str, str]) -> list[Path]:
    """Rewrite every UTF-8 text file under `root` (and the text inside `*.gz` files) in place;
    the files that changed. Binary files (plots) are left alone. In XML (pytest's junit.xml, whose
    failure texts hold tracebacks) the placeholders are written as character references: a bare
    `<env>` there would be an unclosed tag and make the file unreadable."""
    in_xml = {prefix: new.replace("<", "&lt;").replace(">", "&gt;") for prefix, new in prefixes.items()}
    changed = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        packed = path.suffix == ".gz"
        try:
            text = (gzip.decompress(raw) if packed else raw).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError):
            continue
        new = portable_text(text, in_xml if path.suffix == ".xml" else prefixes)
        if new != text:
            data = new.encode("utf-8")
            path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0) if packed else data)
            changed.append(path)
    return changed
