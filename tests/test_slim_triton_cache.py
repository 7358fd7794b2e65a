"""scripts/slim_triton_cache.py keeps each kernel group loadable (every listed file exists) and
only its metadata and binary; groups without a binary are left whole."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "slim_triton_cache.py"


def _group(d: Path, name: str, suffixes: list[str]) -> Path:
    d.mkdir(parents=True)
    children = {}
    for suf in suffixes:
        f = d / f"{name}{suf}"
        f.write_text("x" * 1000)
        children[f.name] = str(f)
    grp = d / f"__grp__{name}.json"
    grp.write_text(json.dumps({"child_paths": children}))
    return grp


def test_slim_keeps_metadata_and_cubin(tmp_path: Path) -> None:
    slim = runpy.run_path(str(SCRIPT))["slim"]
    g1 = _group(tmp_path / "A", "_k", [".json", ".cubin", ".ptx", ".ttir", ".ttgir", ".llir", ".source"])
    g2 = _group(tmp_path / "B", "_other", [".json", ".so"])
    before, after = slim(tmp_path)
    assert after < before
    kept = json.loads(g1.read_text())["child_paths"]
    assert sorted(kept) == ["_k.cubin", "_k.json"]
    assert all(Path(p).exists() for p in kept.values())
    assert sorted(p.name for p in (tmp_path / "A").iterdir()) == ["__grp___k.json", "_k.cubin", "_k.json"]
    assert sorted(json.loads(g2.read_text())["child_paths"]) == ["_other.json", "_other.so"]
