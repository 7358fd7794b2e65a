"""One arm through lm-eval's evaluator: per-question rows (answer, extractions, correctness, tokens).

lm-eval's `simple_evaluate` is run once per arm on a freshly built task object (so no state
leaks between arms), with `log_samples=True`: its samples carry, for each filter (strict-match,
flexible-extract), the extracted answer and lm-eval's exact_match. We merge them with the
backend's record of the same doc id (token ids, counts, finish reason).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lm_eval import evaluator
from lm_eval.tasks import TaskManager

from rltbench.commands.gsm8k.lm import RltbenchLM
from rltbench.commands.gsm8k.tasks import FILTERS, build_task

LM_EVAL_DEFAULT_FEWSHOT_SEED = 1234


@dataclass
class ArmRun:
    arm: str
    rows: dict[int, dict[str, Any]]  # doc_id -> per-question record of this arm
    docs: dict[int, dict[str, Any]]  # doc_id -> {"question", "target"}
    metrics: dict[str, Any]  # lm-eval's aggregated results for the task
    seconds: float  # wall time of generation (generate_until)
    extra: dict[str, Any] = field(default_factory=dict)


def _first(x: Any) -> Any:
    while isinstance(x, (list, tuple)) and len(x) == 1:
        x = x[0]
    return x


def _empty_task_manager(empty_dir: str) -> Any:
    """A TaskManager that indexes no YAML: we pass a ready Task object, and indexing lm-eval's
    thousands of bundled task files costs ~30 s per call on a small CPU."""
    try:
        return TaskManager(include_path=empty_dir, include_defaults=False)
    except TypeError:  # an lm-eval without include_defaults: the slow default still works
        return TaskManager()


def run_arm(
    arm: str,
    lm: RltbenchLM,
    task: str,
    limit: int | None,
    num_fewshot: int | None,
    cache_dir: Path | None = None,
    data_dir: Path | None = None,
) -> ArmRun:
    """Evaluate `task` (first `limit` test questions) with `lm`; returns per-question rows."""
    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)
    task_obj = build_task(task, data_dir=data_dir, cache_dir=cache_dir)
    task_name = task_obj.config.task
    with tempfile.TemporaryDirectory(prefix="rltbench-lmeval-empty-") as empty:
        res = evaluator.simple_evaluate(
            model=lm,
            tasks=[task_obj],
            num_fewshot=num_fewshot,
            limit=limit,
            log_samples=True,
            bootstrap_iters=0,
            fewshot_random_seed=LM_EVAL_DEFAULT_FEWSHOT_SEED,
            task_manager=_empty_task_manager(empty),
        )
    rows: dict[int, dict[str, Any]] = {}
    docs: dict[int, dict[str, Any]] = {}
    for s in res["samples"][task_name]:
        doc_id = int(s["doc_id"])
        flt = s.get("filter", FILTERS[0])
        key = "strict" if flt == "strict-match" else "flexible" if flt == "flexible-extract" else flt
        row = rows.setdefault(doc_id, {})
        row[f"{key}_answer"] = _first(s.get("filtered_resps"))
        row[f"{key}_correct"] = bool(float(_first(s.get("exact_match", 0.0))) > 0.5)
        if "response" not in row:
            row["response"] = _first(s.get("resps"))
        doc = s.get("doc") or {}
        docs.setdefault(doc_id, {"question": doc.get("question"), "target": s.get("target")})
    for doc_id, gen in lm.records.items():
        row = rows.setdefault(doc_id, {})
        row.update(
            gen_tokens=gen.num_tokens,
            token_ids=gen.token_ids,
            finish_reason=gen.finish_reason,
            prompt_tokens=gen.prompt_tokens,
            truncated_prompt=gen.truncated_prompt,
        )
    metrics = dict(res.get("results", {}).get(task_name, {}))
    n_shot = (res.get("n-shot") or {}).get(task_name)
    return ArmRun(
        arm=arm,
        rows=rows,
        docs=docs,
        metrics=metrics,
        seconds=lm.generate_seconds,
        extra={"n_shot": n_shot, "lm_eval_config": res.get("configs", {}).get(task_name, {})},
    )
