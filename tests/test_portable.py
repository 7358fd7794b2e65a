"""rltbench/results/portable.py: a run directory loses the writing machine's paths and nothing else,
and the committed GPU results hold none of them (the repo cites results by directory and commit)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from rltbench.results.portable import machine_prefixes, make_portable, portable_text
from tests.git_tracked import tracked_files

ROOT = Path(__file__).resolve().parent.parent
PREFIXES = {"/srv/ckout": "", "/srv/ckout/.venv": "<env>", "/srv/home": "~", "/srv/tmpdir/": "<tmp>"}
# an absolute path under a directory that only names a machine's own layout; /usr (the CUDA
# toolkit's nvcc, a system python) and URL paths (/v1/completions) say what ran and stay
MACHINE_PATH = re.compile(r"(?<![\w.:/<>-])/(?:work|opt|home|root|tmp|mnt|scratch|srv|data|Users)/")


def test_each_prefix_becomes_relative_or_a_placeholder() -> None:
    text = ('"argv": ["/srv/ckout/.venv/bin/python3", "/srv/ckout/scripts/carryover.py", "--result-dir", '
            '"/srv/ckout/results/gpu/carryover"], "cwd": "/srv/ckout", "cache": "/srv/home/.cache/x", '
            '"trace": "/srv/tmpdir/rltbench-trace-1.json", "other": "/srv/ckout2/x", '
            '"nvcc": "/usr/local/cuda/bin/nvcc"')
    assert portable_text(text, PREFIXES) == (
        '"argv": ["<env>/bin/python3", "scripts/carryover.py", "--result-dir", "results/gpu/carryover"], '
        '"cwd": ".", "cache": "~/.cache/x", "trace": "<tmp>/rltbench-trace-1.json", '
        '"other": "/srv/ckout2/x", "nvcc": "/usr/local/cuda/bin/nvcc"')
    assert portable_text("PYTHONPATH=/srv/ckout:/srv/tmpdir/w", PREFIXES) == "PYTHONPATH=.:<tmp>/w"
    assert portable_text("/mnt/srv/ckout/x /srv/ckout.old/x", PREFIXES) == "/mnt/srv/ckout/x /srv/ckout.old/x"
    assert portable_text("no paths, 10.19 us", PREFIXES) == "no paths, 10.19 us"
    assert portable_text("/usr/bin/x", {"/": "~"}) == "/usr/bin/x"


def test_machine_prefixes_name_this_checkout() -> None:
    prefixes = machine_prefixes(ROOT)
    assert prefixes[str(ROOT.resolve())] == "" and set(prefixes.values()) == {"", "<env>", "~", "<tmp>"}
    assert portable_text(str(ROOT / "results" / "gpu"), prefixes) == "results/gpu"


def test_files_rewritten_in_place_text_and_gzip_binary_untouched(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "manifest.json").write_text('{"command_line": "/srv/ckout/rltbench/cli.py kernels"}\n')
    trace_json = b'{"traceName": "/srv/tmpdir/t.json"}'
    (tmp_path / "sub" / "trace.json.gz").write_bytes(gzip.compress(trace_json, mtime=0))
    png = b"\x89PNG\r\n\x1a\n\xff\xfe/srv/ckout/"
    (tmp_path / "plot.png").write_bytes(png)
    (tmp_path / "table.md").write_text("10.19 us\n")
    changed = make_portable(tmp_path, PREFIXES)
    assert [p.relative_to(tmp_path).as_posix() for p in changed] == ["manifest.json", "sub/trace.json.gz"]
    assert (tmp_path / "manifest.json").read_text() == '{"command_line": "rltbench/cli.py kernels"}\n'
    trace = gzip.decompress((tmp_path / "sub" / "trace.json.gz").read_bytes())
    assert trace == b'{"traceName": "<tmp>/t.json"}'
    assert (tmp_path / "plot.png").read_bytes() == png
    assert make_portable(tmp_path, PREFIXES) == []  # a second pass finds nothing


def test_junit_xml_stays_xml(tmp_path: Path) -> None:
    """A traceback inside junit.xml names the environment: its placeholder must not become a tag."""
    import xml.etree.ElementTree as ET

    failure = "<failure>/srv/ckout/.venv/lib/x.py:3: Error</failure>"
    junit = f'<testsuite><testcase name="t">{failure}</testcase></testsuite>'
    (tmp_path / "junit.xml").write_text(junit)
    make_portable(tmp_path, PREFIXES)
    text = ET.parse(tmp_path / "junit.xml").getroot().find("testcase/failure").text
    assert text == "<env>/lib/x.py:3: Error"


def _machine_paths(path: Path) -> list[str]:
    raw = path.read_bytes()
    try:
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError):
        return []
    return [f"{path.relative_to(ROOT)}: ...{text[max(0, m.start() - 40):m.end() + 40]}..."
            for m in MACHINE_PATH.finditer(text)][:2]


def test_committed_results_name_no_machine_paths() -> None:
    """Only what git tracks: a run the user made here (results/kernels-<time>/) names their paths."""
    files = tracked_files("results")
    assert files, "no committed results found"
    found = [hit for p in files for hit in _machine_paths(p)]
    why = "machine paths in results (scripts/gpu_suite.py makes new ones portable):"
    assert not found, "\n".join([why, *found[:20]])
