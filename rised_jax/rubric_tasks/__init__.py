"""Offline rubric tasks for CriPO: task format, JSONL loader, built-in set, deterministic checker."""
from rised_jax.rubric_tasks.checks import Check, RubricFormatError, parse_check
from rised_jax.rubric_tasks.tasks import (BUILTIN_NAME, BUILTIN_PATH, Criterion, RubricTask, RubricTaskSet,
                                          builtin_task_set, check, check_group, load_jsonl, parse_task,
                                          passes)

__all__ = [
    "BUILTIN_NAME", "BUILTIN_PATH", "Check", "Criterion", "RubricFormatError", "RubricTask",
    "RubricTaskSet", "builtin_task_set", "check", "check_group", "load_jsonl", "parse_check", "parse_task",
    "passes",
]
