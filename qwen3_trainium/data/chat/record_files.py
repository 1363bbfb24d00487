"""Record files as ``(where, record)`` pairs, read as the ``datasets`` library reads them, every
failure a ``RecordError`` that names the file and line (or row) and says how to fix it.

JSON, ``.jsonl`` and ``.json`` alike (``datasets``' json builder has one rule for both,
``packaged_modules/json/json.py``: a file starting with ``[`` is a list of records, any other is
read as JSON Lines): text starting with ``[`` is one JSON document, a list of records
(``file:record N``); any other is JSON Lines, one record a line (``file:N``); when that fails
and the whole text is one JSON value (a pretty-printed record), it is that record. Lines are
split at ``\\n`` only: a string may hold U+2028 or U+0085 unescaped (``json.dumps`` with
``ensure_ascii=False`` writes them so), which ``str.splitlines`` would cut a record at.

Text must be UTF-8, as ``datasets`` requires by default (``encoding="utf-8"``, strict): a leading
byte-order mark is skipped; any other file is refused at the line and byte offset of the first
byte that is not UTF-8, with the ``iconv`` line that converts it.

Parquet: every row a record (``file:row N``); a file pyarrow cannot open, or a string that is
not UTF-8, is refused the same way.
"""

from __future__ import annotations

import codecs
import json
import shlex

JSON_FIX = (
    "make it valid JSON: a .jsonl or .json file holds JSON Lines (one record a line)"
    " or one JSON document (a list of records)"
)
PARQUET_UTF8_FIX = "write the file again with its text as UTF-8"


class RecordError(ValueError):
    """A record this package cannot read: ``where`` (file:line), ``what`` is wrong, and ``fix``
    where the fix is not the record's format; ``message`` is what, then the fix."""

    def __init__(self, where: str, what: str, fix: str | None = None) -> None:
        self.where, self.what, self.fix = where, what, fix
        self.message = f"{what}; {fix}" if fix else what
        super().__init__(f"{where}: {self.message}")


def _reencode(file: str, source: str) -> str:
    q, fixed = shlex.quote(file), shlex.quote(file + ".utf8")
    return f"re-encode it as UTF-8: iconv -f {source} -t utf-8 {q} > {fixed} && mv {fixed} {q}"


def read_text(file: str) -> str:
    """The file's text; one that cannot be read or is not UTF-8 is a RecordError."""
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except OSError as e:  # a broken link in a partly downloaded Hub snapshot, no permission
        fix = "make it readable, or download it again (a broken link in a Hub snapshot is a partial download)"
        raise RecordError(file, f"cannot be read ({e.strerror or e})", fix) from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # Windows PowerShell's `>`
        fix = _reencode(file, "utf-16")
        what = "is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8"
        raise RecordError(f"{file}:1", what, fix)
    try:
        return raw.decode("utf-8-sig")  # a UTF-8 byte-order mark (Windows editors) is skipped
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        fix = _reencode(file, "latin1") + " (text from Windows: -f windows-1252)"
        byte = f"byte 0x{raw[e.start]:02x} at byte offset {e.start}"
        what = f"{byte} is not UTF-8 (the file is in another encoding)"
        raise RecordError(f"{file}:{line}", what, fix) from None


def _lines(text: str, file: str) -> tuple[list[tuple[str, object]], json.JSONDecodeError | None, int]:
    """(records, the first error, its line) of the text read as JSON Lines."""
    out = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((f"{file}:{number}", json.loads(line)))
        except json.JSONDecodeError as e:
            return out, e, number
    return out, None, 0


def _document(text: str, file: str) -> list[tuple[str, object]]:
    data = json.loads(text)
    rows = data if isinstance(data, list) else [data]
    return [(f"{file}:record {i + 1}", row) for i, row in enumerate(rows)]


def read_json(file: str) -> list[tuple[str, object]]:
    """A ``.jsonl`` or ``.json`` file's records; text that is neither form names the line where
    the reading that got further stopped."""
    text = read_text(file)
    if text.lstrip()[:1] == "[":
        try:
            return _document(text, file)
        except json.JSONDecodeError as e:
            raise RecordError(f"{file}:{e.lineno}", f"not valid JSON ({e.msg})", JSON_FIX) from None
    records, error, line = _lines(text, file)
    if error is None:
        return records
    try:
        return _document(text, file)
    except json.JSONDecodeError as e:
        if e.lineno > line:  # a pretty-printed record that breaks further down than line `line`
            line, error = e.lineno, e
    raise RecordError(f"{file}:{line}", f"not valid JSON ({error.msg})", JSON_FIX)


def read_parquet(file: str) -> list[tuple[str, object]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as e:
        what = f"is not a readable Parquet file ({e})"
        raise RecordError(file, what, "write or download it again") from None
    try:
        rows = table.to_pylist()
    except UnicodeDecodeError:  # a string column holding bytes that are not UTF-8
        for i in range(table.num_rows):  # only on failure: which row
            try:
                table.slice(i, 1).to_pylist()
            except UnicodeDecodeError as e:
                what = f"a string holds byte 0x{e.object[e.start]:02x}, which is not UTF-8"
                raise RecordError(f"{file}:row {i + 1}", what, PARQUET_UTF8_FIX) from None
        raise RecordError(file, "a string holds bytes that are not UTF-8", PARQUET_UTF8_FIX) from None
    return [(f"{file}:row {i + 1}", row) for i, row in enumerate(rows)]


def read_file(file: str) -> list[tuple[str, object]]:
    """(where, record) of every record of one file."""
    if file.lower().endswith(".parquet"):
        return read_parquet(file)
    return read_json(file)


def read_records(files: list[str]) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for file in files:
        out += read_file(file)
    return out
