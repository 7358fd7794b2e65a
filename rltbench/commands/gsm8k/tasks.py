"""lm-eval's own gsm8k / gsm8k_cot task definitions, pointed at the GSM8K files shipped in rltbench.

Why this way: scoring must be lm-eval's (prompts, exemplars, stop sequences, strict/flexible
filters), but nothing may be downloaded at run time. We read the task YAML that ships *inside the
installed lm-eval package* (so prompts and filters are exactly that version's), replace only the
data source (`dataset_path: json` + `data_files` -> rltbench/data/gsm8k/{test,train}.jsonl) and
build a `ConfigurableTask` from it; `simple_evaluate` accepts the Task object directly. The hub is
switched off (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE) and the datasets cache goes to a caller-chosen
directory, so a read-only home or a machine with no network still works.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rltbench.errors import UsageError
from rltbench.textcodec import GSM8K_DATA_DIR as DATA_DIR

TASK_YAML = {"gsm8k": "gsm8k.yaml", "gsm8k_cot": "gsm8k-cot.yaml"}
TASKS = tuple(TASK_YAML)
STRICT, FLEXIBLE = "strict-match", "flexible-extract"
FILTERS = (STRICT, FLEXIBLE)
LM_EVAL_REQUIREMENT = "lm-eval>=0.4.5,<0.5"


def set_offline_env() -> None:
    """Forbid hub access for datasets / huggingface_hub (must run before `datasets` is imported;
    also patched into an already imported `datasets.config`)."""
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[key] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        cfg = sys.modules.get("datasets.config")
        if cfg is not None:
            cfg.HF_DATASETS_OFFLINE = True
            if hasattr(cfg, "HF_HUB_OFFLINE"):
                cfg.HF_HUB_OFFLINE = True
    except Exception:  # best effort only; the env vars above are the main switch
        pass


def import_lm_eval() -> Any:
    """Import lm_eval (offline) or raise a UsageError that says how to install it."""
    set_offline_env()
    try:
        import lm_eval  # noqa: F401  (optional dependency: checked here, with the install line)
        from lm_eval.api.task import ConfigurableTask  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"rltbench gsm8k needs lm-eval: pip install '{LM_EVAL_REQUIREMENT}' ({exc})"
        ) from None
    return lm_eval


def lm_eval_version() -> str:
    try:
        return version("lm_eval")
    except Exception:
        return "unknown"


def task_yaml_path(task: str) -> Path:
    if task not in TASK_YAML:
        raise UsageError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    lm_eval = import_lm_eval()
    path = Path(lm_eval.__file__).resolve().parent / "tasks" / "gsm8k" / TASK_YAML[task]
    if not path.is_file():
        raise UsageError(f"lm-eval {lm_eval_version()} has no {path.name}; install '{LM_EVAL_REQUIREMENT}'")
    return path


def _load_yaml(path: Path) -> dict[str, Any]:
    """The task YAML, with a top-level `include:` merged in (older lm-eval layouts use one)."""
    import yaml  # lm-eval's dependency, not ours: present whenever lm-eval is

    cfg = yaml.safe_load(path.read_text())
    include = cfg.pop("include", None)
    if include:
        base = _load_yaml(path.parent / include)
        base.update(cfg)
        cfg = base
    return cfg


def task_config(task: str, data_dir: Path | None = None, cache_dir: Path | None = None) -> dict[str, Any]:
    """lm-eval's config dict for `task` with the data source replaced by local json files."""
    data_dir = Path(data_dir) if data_dir is not None else DATA_DIR
    files = {split: data_dir / f"{split}.jsonl" for split in ("test", "train")}
    for path in files.values():
        if not path.is_file():
            raise UsageError(f"GSM8K data file missing: {path}")
    cfg = _load_yaml(task_yaml_path(task))
    for key in ("tag", "group"):  # membership in lm-eval's groups is irrelevant for a standalone task
        cfg.pop(key, None)
    kwargs: dict[str, Any] = {"data_files": {k: str(v) for k, v in files.items()}}
    if cache_dir is not None:
        kwargs["cache_dir"] = str(cache_dir)
    cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs=kwargs)
    return cfg


def build_task(task: str, data_dir: Path | None = None, cache_dir: Path | None = None) -> Any:
    """A ready lm-eval `ConfigurableTask` (loads the local json files through `datasets`, offline)."""
    cfg = task_config(task, data_dir=data_dir, cache_dir=cache_dir)
    import_lm_eval()
    from lm_eval.api.task import ConfigurableTask  # optional dependency, checked just above

    return ConfigurableTask(config=cfg)


def stop_sequences(task_obj: Any) -> list[str]:
    """The task's `until` strings (for the console/manifest; requests carry their own)."""
    gen = task_obj.config.generation_kwargs or {}
    until = gen.get("until", [])
    return [until] if isinstance(until, str) else list(until)


def apply_filters(task_obj: Any, responses: list[str], doc: dict[str, Any]) -> dict[str, str]:
    """Run the task's own filter pipelines (strict/flexible extraction) on raw responses of one doc.

    Used by tests to check extraction on known answers through lm-eval's code, not a private regex.
    """
    from lm_eval.api.instance import Instance  # optional dependency (tests call this with it)

    out: dict[str, str] = {}
    for ensemble in task_obj._filters:
        inst = Instance(request_type="generate_until", doc=doc, arguments=("", {}), idx=0)
        inst.resps = list(responses)
        ensemble.apply([inst])
        out[ensemble.name] = inst.filtered_resps[ensemble.name]
    return out
