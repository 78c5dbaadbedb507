# ruff: noqa: RUF001  (C-Eval's prompt uses full-width punctuation)
"""workloads/ceval-gen: the generative C-Eval task loads with lm-eval's own task
manager and its filter reads the letter a chat model writes (thinking or not)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TASK_DIR = Path(__file__).parents[2] / "workloads" / "ceval-gen"


def test_lm_eval_loads_the_task_and_its_filter_takes_the_last_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(TASK_DIR)  # the task's sample data path is relative
    task = TaskManager(include_path=os.fspath(TASK_DIR)).load(["ceval-gen"])["tasks"]["ceval-gen"]
    docs = list(task.test_docs())
    assert len(docs) == 3 and task.config.output_type == "generate_until"
    assert task.doc_to_text(docs[0]) == "1 + 1 等于多少？\nA. 1\nB. 2\nC. 3\nD. 4\n答案："
    assert [task.doc_to_target(d) for d in docs] == ["B", "C", "A"]
    answers = [
        ["<think>\n答案可能是A？再想想。\n</think>\n\n答案：B。"],  # thinking, then the answer
        ["The answer is C. Answer: C"],
        ["不知道"],
    ]
    [ensemble] = task._filters
    for step in ensemble.filters:
        answers = step().apply(answers, docs)
    assert list(answers) == ["B", "C", "[invalid]"]
