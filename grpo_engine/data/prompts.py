"""Prompt datasets (JSONL, Parquet, a `datasets` directory, a Hub dataset id) and the resumable prompt sampler.

Rows stay plain dicts: the `prompt` column is rendered to text (chat template for message lists) and every
other column is handed to the reward functions, as TRL does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any, Optional

from transformers import PreTrainedTokenizerBase

from ..config.schema import DATASET_DICT_FILE, is_hub_id
from ..hub import load_hub_dataset
from ..state.bounded_read import (DATA_LINE_BYTES, FileBoundError, bounded_lines, parse_json, read_bounded_bytes,
                                  special_file_kind)
from .chat_messages import (BLANK, content_text, continues_final_message, conversation_problem, dropped_message,
                            message_written_as_text, messages_problem, messages_written_as_text, missing_assistant_turn, special_token_as_text,
                            unused_system_prompt, visible)
from .row_values import RowValueError, check_column_names, check_row_values, lookalike_note, strict_json_hooks


_log = logging.getLogger(__name__)


class DataError(ValueError):
    pass


def load_rows(path: str, hub_config: Optional[str] = None, hub_split: str = "train") -> list[dict[str, Any]]:
    """All rows of a .jsonl/.json file, a .parquet file, a directory written by `datasets.save_to_disk` (the split
    `hub_split` of a DatasetDict), or the split `hub_split` (configuration `hub_config`) of a Hub dataset id
    ORG/NAME."""
    source = Path(path).expanduser()
    if not source.exists() and is_hub_id(path):
        rows = load_hub_dataset(path, hub_config, hub_split)
    elif not source.exists():
        raise DataError(f"dataset {path!r} does not exist")
    elif special_file_kind(source) is not None:
        raise DataError(f"dataset {path!r} is {special_file_kind(source)}, not a regular file or a directory; "
                        f"save the data to a file")
    elif source.is_dir() and not any((source / marker).is_file() for marker in _DATASETS_DIR_MARKERS):
        rows = _load_shards(source)
    elif source.is_dir():
        rows = _load_datasets_dir(source, hub_split)
    elif file_format(source) is not None:
        rows = _load_file(source)
    else:
        raise DataError(f"dataset {path!r}: unsupported format (use .jsonl, .json, .parquet, a directory of such "
                        f"files or a datasets directory)")
    if not rows:
        raise DataError(f"dataset {path!r} is empty")
    try:
        check_row_values(rows, path)
        check_column_names(rows, path)
    except RowValueError as exc:
        raise DataError(str(exc)) from None
    return rows


# Each data file's format by its suffix, in any case (Windows tools write DATA.JSONL); .ndjson is JSONL's other name.
_FILE_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}


def file_format(path: Path) -> Optional[str]:
    """'jsonl', 'json' or 'parquet' by `path`'s suffix (any case), or None for a file of no format read here."""
    return _FILE_FORMATS.get(path.suffix.lower())
# What datasets.save_to_disk writes at a directory's top (a Dataset, a DatasetDict).
_DATASETS_DIR_MARKERS = ("state.json", DATASET_DICT_FILE)


def _load_file(source: Path) -> list[dict[str, Any]]:
    if file_format(source) != "parquet":
        return _load_json(source)
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"reading {str(source)!r} needs pyarrow: pip install pyarrow") from exc
    return pq.read_table(source).to_pylist()


def _load_shards(source: Path) -> list[dict[str, Any]]:
    """A directory of data files of one format (`part-0.parquet`, `part-1.parquet`, ... as Spark or a sharded
    export writes them), read in name order as one dataset; anything else in it is named, not skipped."""
    files = sorted(p for p in source.iterdir() if not p.name.startswith((".", "_")))
    formats = {file_format(p) for p in files if p.is_file()}
    others = [p.name for p in files if not p.is_file() or file_format(p) is None]
    if not files or others or len(formats) != 1:
        found = (f"it holds {', '.join(others[:3])}" if others else
                 f"it mixes {', '.join(sorted('.' + kind for kind in formats))}" if files else "it is empty")
        if (source / "README.md").is_file():  # a dataset card: `huggingface-cli download --local-dir` wrote it
            found += (" (a copy of a Hub dataset repository, by its README.md: name its Hub id ORG/NAME, or the data "
                      "file or directory of files inside it to read)")
        raise DataError(f"dataset directory {str(source)!r} is neither a datasets directory (save_to_disk) nor a "
                        f"directory of .jsonl, .json or .parquet files of one format: {found}")
    for file in files:
        kind = special_file_kind(file)
        if kind is not None:
            raise DataError(f"dataset shard {str(file)!r} is {kind}, not a regular file")
    return [row for file in files for row in _load_file(file)]


class _DuplicateKey(ValueError):
    pass


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: json keeps the last of a repeated key silently (a row's
    prompt or answer replaced by a later one), as strict YAML refuses the same in a config file."""
    row: dict[str, Any] = {}
    for key, value in pairs:
        if key in row:
            raise _DuplicateKey(key)
        row[key] = value
    return row


def _parse_json(text: str, where: str) -> Any:
    try:
        return parse_json(text, where, object_pairs_hook=_object_without_duplicate_keys, **strict_json_hooks())
    except RowValueError as exc:
        raise DataError(f"{where}: {exc}") from None
    except _DuplicateKey as exc:
        raise DataError(f"{where}: the key {exc.args[0]!r} appears twice in one object") from None
    except FileBoundError as exc:
        raise DataError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: invalid JSON ({exc.msg})") from exc


def _load_json(source: Path) -> list[dict[str, Any]]:
    """A JSONL file row by row, each line read within DATA_LINE_BYTES (a runaway line is refused when reading
    reaches the bound, not after it filled memory); a .json file holding one array, within the same bound."""
    with source.open("rb") as file:
        head = file.read(8)
    packed = next((kind for magic, kind in _ARCHIVE_MAGIC.items() if head.startswith(magic)), None)
    if packed:
        raise DataError(f"{source}: the file is {packed}, not text; unpack it and name the {source.suffix} file "
                        f"inside")
    if file_format(source) == "json" and _starts_an_array(source):
        try:
            text = _utf8(read_bounded_bytes(source, DATA_LINE_BYTES, "a JSON dataset read whole"), source, 1)
        except FileBoundError as exc:
            raise DataError(f"{exc}; write it as JSONL (one row a line)") from None
        rows = _parse_json(text, str(source))
        if not isinstance(rows, list):
            raise DataError(f"{source}: a JSON dataset must hold an array of rows")
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(f"{source}: row {i} of its array is {_json_kind(row)}, not a JSON object of columns")
        return rows
    try:
        lines = [(number, _utf8(raw, source, number))
                 for number, raw in bounded_lines(source, DATA_LINE_BYTES, "a row of a JSONL dataset")]
    except FileBoundError as exc:
        raise DataError(str(exc)) from None
    rows = []
    for index, (number, line) in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = _parse_json(line, f"{source}:{number}")
        except DataError:
            spread = _value_over_lines(lines, index)
            if spread is not None:
                raise DataError(_spread_message(source, number, *spread)) from None
            raise
        if not isinstance(row, dict):
            hint = "; an array of rows belongs in a .json file" if isinstance(row, list) else ""
            raise DataError(f"{source}:{number}: the row is {_json_kind(row)}, not a JSON object of columns "
                            f"({{\"prompt\": ...}}){hint}")
        rows.append(row)
    return rows


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "true / false", type(None): "null"}
    return next((name for kind, name in kinds.items() if isinstance(value, kind)), "a number")


def _value_over_lines(lines: list[tuple[int, str]], index: int) -> Optional[tuple[int, Any]]:
    """(its last line's number, the value) when a JSON value starts at lines[index] and ends on a later line: a
    pretty-printed file (`json.dump(rows, f, indent=2)`), whose first line alone is not JSON; else None."""
    text = "\n".join(line for _, line in lines[index:])
    try:
        value, end = json.JSONDecoder().raw_decode(text, len(text) - len(text.lstrip()))
    except (ValueError, RecursionError):  # not JSON there either (an integer past Python's digits included)
        return None
    last = index + text.count("\n", 0, end)
    return (lines[last][0], value) if last > index else None


def _spread_message(source: Path, first: int, last: int, value: Any) -> str:
    """A JSON value written over several lines of a file read one row a line: what it is, and how to write it."""
    where = f"{source}:{first}-{last}: one JSON"
    if isinstance(value, list):
        return (f"{where} array of {len(value)} values written over {last - first + 1} lines; a .jsonl file holds one "
                f"row object a line: name the file .json (an array of row objects) or write one row a line")
    keys = f" (keys: {', '.join(repr(str(key))[:40] for key in list(value)[:5])})" if isinstance(value, dict) else ""
    return (f"{where} {'object' if isinstance(value, dict) else 'value'}{keys} written over {last - first + 1} lines; "
            f"the file is read one row a line (JSONL): write each row object on one line (json.dumps without indent), "
            f"or one array of row objects in a .json file")


def _starts_an_array(source: Path) -> bool:
    with source.open("rb") as file:
        return file.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[")


# The first bytes of the compressed and archive formats a data file is most often shipped in
_ARCHIVE_MAGIC = {b"\x1f\x8b": "gzip-compressed", b"BZh": "bzip2-compressed", b"\xfd7zXZ\x00": "xz-compressed",
                  b"\x28\xb5\x2f\xfd": "zstd-compressed", b"PK\x03\x04": "a zip archive",
                  b"7z\xbc\xaf\x27\x1c": "a 7-Zip archive"}


def _utf8(data: bytes, source: Path, first_line: int) -> str:
    """`data` (starting at line `first_line` of `source`) as text; not UTF-8: one line with the line and column.
    The byte-order mark some editors put at the start of a UTF-8 file (Windows' Notepad, Excel's export) is not
    part of a row, at the first line or at the start of a file concatenated after it."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start)
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DataError(f"{source}:{line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at column {column}); "
                        f"save the file as UTF-8") from None


def _load_datasets_dir(source: Path, split: str) -> list[dict[str, Any]]:
    """A saved Dataset, or the split `split` of a saved DatasetDict: its "train" split was read for every setting,
    so an evaluation on data.eval_split "test" of a DatasetDict directory scored the training rows, silently."""
    try:
        import datasets
    except ImportError as exc:
        raise DataError(f"reading the directory {str(source)!r} needs the `datasets` package: "
                        f"pip install datasets") from exc
    loaded = datasets.load_from_disk(str(source))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{source}: a DatasetDict without a {split!r} split (splits: {', '.join(loaded)}); name "
                            f"one with data.split (data.eval_split for data.eval_path)")
        loaded = loaded[split]
    return loaded.to_list()


def load_prompt_rows(path: str, column: str, max_prompt_chars: Optional[int], hub_config: Optional[str] = None,
                     hub_split: str = "train", system_prompt: Optional[str] = None) -> list[dict[str, Any]]:
    """The rows of a prompt dataset, each checked to hold a prompt of a length that can be tokenized; prompts that
    `system_prompt` (data.system_prompt) is not added to are said in a warning."""
    rows = load_rows(path, hub_config, hub_split)
    check_prompt_column(rows, column, path)
    check_prompt_lengths(rows, column, path, max_prompt_chars)  # first: what reads a prompt whole reads a bounded one
    check_prompts_present(rows, column, path)
    unused = unused_system_prompt(rows, column, f"dataset {path!r}") if system_prompt is not None else None
    if unused:
        _log.warning(f"warning: {unused}")
    return rows


def check_prompts_present(rows: list[dict[str, Any]], column: str, source: str) -> None:
    """Each prompt is text or chat messages with some content: an empty one gives the model nothing to continue
    (`generate` fails on it deep inside, after the model loaded)."""
    for i, row in enumerate(rows):
        prompt = row[column]
        if not isinstance(prompt, (str, list)):
            raise DataError(f"dataset {source!r} row {i}: the prompt ({column!r}) must be a string or a list of "
                            f"{{'role', 'content'}} messages, got {type(prompt).__name__} {prompt!r:.60}")
        problem = None
        if isinstance(prompt, list):  # messages without any text are "empty", said below
            problem = messages_problem(prompt) or (prompt_chars(prompt) and (conversation_problem(prompt)
                                                                             or message_written_as_text(prompt)))
        if problem:
            raise DataError(f"dataset {source!r} row {i}: the prompt ({column!r}) is a list of chat messages, and "
                            f"{problem}")
        if not prompt_chars(prompt):
            raise DataError(f"dataset {source!r} row {i}: the prompt ({column!r}) is empty")
        if isinstance(prompt, str) and not visible(prompt):
            raise DataError(f"dataset {source!r} row {i}: the prompt ({column!r}) is empty ({BLANK})")
        encoded = messages_written_as_text(prompt) if isinstance(prompt, str) else None
        if encoded:
            raise DataError(f"dataset {source!r} row {i}: the prompt ({column!r}) is text holding chat messages "
                            f"written as {encoded}, which the model would read as brackets and quotes; "
                            f"store the list itself (a JSON array of {{'role', 'content'}} objects)")


def check_prompt_column(rows: list[dict[str, Any]], column: str, source: str) -> None:
    missing = [i for i, row in enumerate(rows) if column not in row]
    if missing:
        columns = sorted(rows[missing[0]].keys())
        raise DataError(f"dataset {source!r} has no {column!r} column in row {missing[0]} (columns: {columns})"
                        f"{lookalike_note(column, columns)}; set data.prompt_column to the column that holds the "
                        f"prompt")


def prompt_chars(prompt: Any) -> int:
    """Characters of a text prompt, or of the contents of chat messages."""
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(content_text(m.get("content"))) for m in prompt if isinstance(m, dict))
    return 0  # not a prompt at all: render_prompt says so


def check_prompt_lengths(rows: list[dict[str, Any]], column: str, source: str, max_chars: Optional[int]) -> None:
    """Refuses a runaway prompt before anything tokenizes it: a tokenizer takes every character of its input
    before truncating, so a line of megabytes stalls the run for minutes with gigabytes of memory."""
    if max_chars is None:
        return
    for i, row in enumerate(rows):
        chars = prompt_chars(row[column])
        if chars > max_chars:
            raise DataError(f"dataset {source!r} row {i}: the prompt has {chars:,} characters, more than "
                            f"data.max_prompt_chars ({max_chars:,}); shorten or drop that row, or raise "
                            f"data.max_prompt_chars")


def render_prompt(prompt: Any, tokenizer: PreTrainedTokenizerBase, system_prompt: Optional[str]) -> str:
    """Plain text stays as is; chat messages (or text with a system prompt) go through the chat template."""
    if isinstance(prompt, str) and system_prompt is None:
        return prompt  # rendered already: its special tokens are the markup its author wrote
    injected = special_token_as_text(prompt if isinstance(prompt, list) else [{"content": prompt}], system_prompt,
                                     getattr(tokenizer, "all_special_tokens", []))
    if injected:
        raise DataError(f"{injected}: the tokenizer reads it as that token inside the chat template's markup (a turn "
                        f"ended early, a role injected); remove it from the text")
    if isinstance(prompt, str):
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        messages = list(prompt)
        if system_prompt is not None and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
    else:
        raise DataError(f"a prompt must be a string or a list of {{'role', 'content'}} messages, got {prompt!r:.80}")
    if not getattr(tokenizer, "chat_template", None):
        why = "data.system_prompt is set" if isinstance(prompt, str) else "the prompt is a list of chat messages"
        raise DataError(f"{why}, which needs a tokenizer with a chat template, and the model's tokenizer has none "
                        f"(chat_template.jinja or tokenizer_config.json's chat_template)")
    continued = continues_final_message(messages)  # TRL's rendering: the model goes on with a prefilled answer
    # A prefill is looked for whole first: transformers' own refusal of one the template drops names no message.
    rendered = _chat_template_text(tokenizer, messages, add_generation_prompt=not continued)
    dropped = dropped_message(messages, rendered)
    if dropped:
        raise DataError(f"the model's chat template renders these messages without {dropped}, so the model would "
                        f"never see it; fix the template (chat_template.jinja or tokenizer_config.json's "
                        f"chat_template)")
    unanswered = missing_assistant_turn(messages, rendered)
    if unanswered:
        raise DataError(f"the model's chat template ends the prompt with the text of {unanswered} and opens no "
                        f"assistant turn after it (it ignores add_generation_prompt), so the model would continue "
                        f"that message instead of answering it; fix the template (chat_template.jinja or "
                        f"tokenizer_config.json's chat_template)")
    return _chat_template_text(tokenizer, messages, continue_final_message=True) if continued else rendered


def _chat_template_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **options: bool) -> Any:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **options)
    except Exception as exc:  # jinja's syntax errors, a template's raise_exception("..."): any type, one line
        raise DataError(f"the model's chat template cannot render these messages ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:160]})") from None


def render_prompts(rows: list[dict[str, Any]], column: str, tokenizer: PreTrainedTokenizerBase,
                   system_prompt: Optional[str], source: str) -> list[str]:
    """Each row's prompt rendered (render_prompt); a row the tokenizer's chat template refuses is named."""
    rendered = []
    for i, row in enumerate(rows):
        try:
            rendered.append(render_prompt(row[column], tokenizer, system_prompt))
        except DataError as exc:
            raise DataError(f"{source} row {i}: {exc}") from None
    return rendered


class PromptSampler:
    """An endless, reproducible stream of row indices: a fresh permutation per epoch (seed + epoch).

    Its whole state is (epoch, offset), saved in every checkpoint, so a resumed run draws exactly the
    prompts the uninterrupted run would have drawn, including batches that straddle an epoch boundary.
    """

    def __init__(self, num_rows: int, seed: int, shuffle: bool = True) -> None:
        if num_rows <= 0:
            raise DataError("cannot sample from an empty dataset")
        self.num_rows, self.seed, self.shuffle = num_rows, seed, shuffle
        self.epoch, self.offset = 0, 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_indices(self, count: int) -> list[int]:
        indices: list[int] = []
        while len(indices) < count:
            order = self._order(self.epoch)
            take = min(count - len(indices), self.num_rows - self.offset)
            indices.extend(order[self.offset: self.offset + take])
            self.offset += take
            if self.offset == self.num_rows:
                self.epoch, self.offset = self.epoch + 1, 0
        return indices

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not (epoch >= 0 and 0 <= offset < self.num_rows):  # a position past the rows would skip them silently
            raise DataError(f"the saved prompt position (epoch {epoch}, offset {offset}) is not one in the "
                            f"{self.num_rows} rows of the data")
        self.epoch, self.offset = epoch, offset


def reward_columns(rows: list[dict[str, Any]], prompt_column: str) -> dict[str, list[Any]]:
    """Every non-prompt column as a list aligned with `rows` (missing values become None)."""
    names = sorted({key for row in rows for key in row if key != prompt_column})
    return {name: [row.get(name) for row in rows] for name in names}


def data_fingerprint(rows: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """What a checkpoint keeps of the rows it trained on: their count and a SHA-256 of their content in order
    (row by row, keys sorted), so a resume can tell the same data from data regenerated at the same path."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=repr, ensure_ascii=False).encode("utf-8", "replace"))
        digest.update(b"\n")
    return {"source": source, "rows": len(rows), "sha256": digest.hexdigest()}
