"""Result records read back: the one loader every reader uses (compare, the calibration, portability,
submit, tune, collect, the CLI's validate). A record is what schemas/record.schema.json accepts,
nothing less; a folder's *.json are its records, except the files a results folder holds beside
them (record.NOT_RECORDS). A named file that is not a record is an error; a folder's member that is
not one is a problem the caller reports or skips, by its own rule, but never reads as a record."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import HarnessError
from ..record import NOT_RECORDS, ResultRecord, validate_record


def read_json(path: Path) -> Any:
    """A file's JSON (NaN and Infinity tokens parsed, for the validators to refuse); HarnessError
    naming the file when it is not readable JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: bad JSON or bad UTF-8
        raise HarnessError(f"{path}: not a readable JSON file: {exc}") from None


def load_record(path: Path) -> ResultRecord:
    """One record file, validated; HarnessError naming the file and what is wrong."""
    return ResultRecord.from_dict(read_json(path), str(path))


def record_files(paths: Iterable[str | Path], recursive: bool = False) -> list[tuple[Path, bool]]:
    """(file, named) of every file given (named) and every *.json in a folder given (recursive: in its
    subfolders too), NOT_RECORDS left out; a path that does not exist is an error."""
    out: list[tuple[Path, bool]] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = path.rglob("*.json") if recursive else path.glob("*.json")
            out += [(f, False) for f in sorted(found) if f.name not in NOT_RECORDS]
        elif path.is_file():
            out.append((path, True))
        else:
            raise HarnessError(f"{path}: no such file or folder")
    return out


def none_found(paths: Iterable[str | Path]) -> str:
    """'no result records in OUT', naming the subfolders that hold records when a folder's own level has
    none (a tune's trials are in step1/, step2/, ...; a nightly's in repeat-1/, ...): name those."""
    below = sorted({str(f.parent) for p in map(Path, paths) if p.is_dir()
                    for f in p.rglob("*.json") if f.parent != p and f.name not in NOT_RECORDS and _is_record(f)})
    hint = (f" (records lie in its subfolders: {', '.join(below[:6])}{', ...' if len(below) > 6 else ''};"
            f" name them)" if below else "")
    return f"no result records in {', '.join(map(str, paths))}{hint}"


def _is_record(path: Path) -> bool:
    try:
        return not validate_record(read_json(path))
    except HarnessError:
        return False


@dataclass
class Loaded:
    records: list[tuple[Path, ResultRecord]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """'file: why' of every folder member that is not a record (strict=False)."""


def load_records(paths: Iterable[str | Path], *, recursive: bool = False, strict: bool = False,
                 heading: str = "not records") -> Loaded:
    """Every record in files and folders. A named file that is not a valid record is an error, and
    so is a folder's member when `strict`; otherwise the member goes to `skipped` with its reason.
    The errors are raised together, one line each, under `heading`."""
    loaded, errors = Loaded(), []
    for path, named in record_files(paths, recursive):
        try:
            data = read_json(path)
            problems = validate_record(data)
            if problems:
                raise HarnessError(f"{path}: not a valid record: {problems[0]}")
            loaded.records.append((path, ResultRecord.from_dict(data, str(path))))
        except HarnessError as exc:
            (errors if named or strict else loaded.skipped).append(str(exc))
    if errors:
        raise HarnessError(f"{heading}:\n  " + "\n  ".join(errors))
    return loaded
