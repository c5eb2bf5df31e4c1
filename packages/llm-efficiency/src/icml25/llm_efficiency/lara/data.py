"""LaRA: Benchmarking Retrieval-Augmented Generation and Long-Context LLMs — ICML 2025, P38: the data format and its loader.

Li et al., ICML 2025 (official code and data: Alibaba-NLP/LaRA). The released ``datasets/`` directory holds
the long documents under ``{length}/{context_type}/`` (``length`` in ``32k``, ``128k``; ``context_type`` in
``book``, ``financial``, ``paper``) and the queries in ``query/{length}_{context_type}_{task}.jsonl``, one
JSON object a line with ``type`` (context type), ``level`` (task), ``length``, ``file`` (the document's
file name), ``question``, ``answer`` and ``context_order`` or ``comp_parts``. :func:`load_lara` reads such a
local copy (nothing is downloaded); :func:`save_lara` writes items and documents in the same layout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CONTEXT_TYPES", "LENGTHS", "TASKS", "LaraItem", "load_lara", "read_document", "save_lara"]

LENGTHS = ("32k", "128k")
CONTEXT_TYPES = ("book", "financial", "paper")
TASKS = ("location", "reasoning", "comp", "hallu")
_TASK_ALIASES = {"comparison": "comp", "hallucination": "hallu", "hallu_detection": "hallu"}
_KNOWN_FIELDS = ("type", "level", "length", "file", "question", "answer")


@dataclass(frozen=True)
class LaraItem:
    """One LaRA query: ``task`` is one of :data:`TASKS`; ``meta`` keeps every other field of the record
    (``context_order``, ``comp_parts``, ...)."""

    length: str
    context_type: str
    task: str
    doc_id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The official JSON record of this item (``level`` = task, ``type`` = context type, ``file`` = doc id)."""
        return {
            **self.meta,
            "type": self.context_type,
            "level": self.task,
            "length": self.length,
            "file": self.doc_id,
            "question": self.question,
            "answer": self.answer,
        }


def canonical_task(name: object, where: str = "task") -> str:
    """``name`` as one of :data:`TASKS` (``comparison``/``hallucination`` accepted as aliases)."""
    if not isinstance(name, str):
        raise TypeError(f"{where} must be a str naming one of {TASKS}, got {type(name).__name__}")
    task = _TASK_ALIASES.get(name.strip().lower(), name.strip().lower())
    if task not in TASKS:
        raise ValueError(f"{where} must be one of {TASKS} (or 'comparison'/'hallucination'), got {name!r}")
    return task


def _names(values: object, allowed: Sequence[str] | None, what: str) -> tuple[str, ...]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a sequence of str, got {type(values).__name__}")
    out = tuple(values)
    if not out or not all(isinstance(v, str) and v for v in out):
        raise ValueError(f"{what} must be a non-empty sequence of non-empty str, got {out!r}")
    if allowed is not None:
        bad = [v for v in out if v not in allowed]
        if bad:
            raise ValueError(f"{what} must be drawn from {tuple(allowed)}, got {bad}")
    return out


def _document_path(root: Path, item: LaraItem) -> Path:
    return root / item.length / item.context_type / item.doc_id


def read_document(root: str | Path, item: LaraItem) -> str:
    """The text of ``item``'s document, ``root/{length}/{context_type}/{doc_id}``."""
    path = _document_path(Path(root), item)
    if not path.is_file():
        raise FileNotFoundError(f"document of {item.doc_id!r} not found: {path} does not exist")
    return path.read_text(encoding="utf-8")


def _item(record: Mapping[str, Any], where: str) -> LaraItem:
    if not isinstance(record, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(record).__name__}")
    missing = [k for k in _KNOWN_FIELDS if k not in record]
    if missing:
        raise ValueError(f"{where} lacks the fields {missing} (every LaRA record has {list(_KNOWN_FIELDS)})")
    for k in _KNOWN_FIELDS:
        if not isinstance(record[k], str):
            raise ValueError(f"{where}: field {k!r} must be a str, got {type(record[k]).__name__}")
    return LaraItem(
        length=record["length"],
        context_type=record["type"],
        task=canonical_task(record["level"], f"{where}: field 'level'"),
        doc_id=record["file"],
        question=record["question"],
        answer=record["answer"],
        meta={k: v for k, v in record.items() if k not in _KNOWN_FIELDS},
    )


def load_lara(
    root: str | Path,
    lengths: Sequence[str] = LENGTHS,
    context_types: Sequence[str] = CONTEXT_TYPES,
    tasks: Sequence[str] = TASKS,
    *,
    check_documents: bool = True,
) -> list[LaraItem]:
    """The LaRA queries of a local copy of the official ``datasets/`` directory.

    Reads ``root/query/{length}_{context_type}_{task}.jsonl`` for every combination (a missing query file is
    skipped: the release does not hold every combination for every length); blank lines are skipped.
    ``level`` is mapped to ``task`` (unknown task names are an error). With ``check_documents`` every
    referenced document must exist under ``root/{length}/{context_type}/``.
    """
    if not isinstance(root, (str, Path)):
        raise TypeError(
            f"root must be a str or Path (a local copy of LaRA's datasets/), got {type(root).__name__}"
        )
    root = Path(root)
    if not (root / "query").is_dir():
        raise FileNotFoundError(f"root must hold LaRA's query/ directory: {root / 'query'} does not exist")
    lengths = _names(lengths, None, "lengths")
    context_types = _names(context_types, CONTEXT_TYPES, "context_types")
    tasks = tuple(canonical_task(t, "tasks") for t in _names(tasks, None, "tasks"))
    items: list[LaraItem] = []
    for length in lengths:
        for ctx in context_types:
            for task in tasks:
                path = root / "query" / f"{length}_{ctx}_{task}.jsonl"
                if not path.is_file():
                    continue
                for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n} is not valid JSON ({e.msg})") from None
                    item = _item(record, f"{path}:{n}")
                    if item.task != task:
                        raise ValueError(f"{path}:{n} has level {record['level']!r} in the {task!r} file")
                    if check_documents and not _document_path(root, item).is_file():
                        raise FileNotFoundError(
                            f"{path}:{n} names a missing document: {_document_path(root, item)} does not exist"
                        )
                    items.append(item)
    if not items:
        raise ValueError(
            f"no LaRA queries under {root / 'query'} for lengths={lengths}, context_types={context_types}, "
            f"tasks={tasks}"
        )
    return items


def save_lara(
    root: str | Path, items: Sequence[LaraItem], documents: Mapping[tuple[str, str, str], str]
) -> Path:
    """Write ``items`` and ``documents`` (keyed ``(length, context_type, doc_id)``) in LaRA's layout under
    ``root``; :func:`load_lara` reads them back. Returns ``root``."""
    root = Path(root)
    if not items:
        raise ValueError("items must hold at least one LaraItem, got an empty sequence")
    files: dict[Path, list[str]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, LaraItem):
            raise TypeError(f"items[{i}] must be a LaraItem, got {type(item).__name__}")
        if (item.length, item.context_type, item.doc_id) not in documents:
            raise ValueError(f"documents lacks {(item.length, item.context_type, item.doc_id)} (items[{i}])")
        path = root / "query" / f"{item.length}_{item.context_type}_{item.task}.jsonl"
        files.setdefault(path, []).append(json.dumps(item.to_record(), ensure_ascii=False))
    for (length, ctx, doc_id), text in documents.items():
        path = root / length / ctx / doc_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
