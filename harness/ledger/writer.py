"""Append-only ledger writer that loses nothing already written when its process is SIGKILLed.

Each writer process owns one JSON-lines segment. Every event is one ``os.write`` on an
``O_APPEND`` descriptor: once the call returns the bytes are in the kernel's page cache, so a
SIGKILL of the writer (the crash the harness injects) cannot lose them. There is no user-space
buffer to flush. A machine crash can lose the tail; the harness does not simulate that.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import Any

from harness.jsontext import dumps_sorted
from harness.ledger.schema import PACKED_COLUMNS, Kind

_ROW = json.JSONEncoder(separators=(",", ":"))
_EMPTY_DETAIL = '"{}"'
BATCH_BYTES = 1 << 20  # a batch writes what it holds once it holds this much
PACK_EVENTS = 2_048  # the most events one packed row holds (a Kafka batch's deliveries: about 300 KB)
_list = json.JSONEncoder(separators=(",", ":")).encode  # a list of text or numbers, in C


def _column(name: str, texts: Sequence[str]) -> str:
    """Return a packed row's ``name`` column from its values as JSON text: once when every event's is
    the same, else the list of them under its plural."""
    if texts.count(texts[0]) == len(texts):
        return f'"{name}":{texts[0]}'
    return f'"{PACKED_COLUMNS[name]}":[{",".join(texts)}]'


def _field(value: object) -> str:
    """Return ``value`` as JSON, as ``_ROW`` writes it: text and whole numbers directly (text through
    the C escaper), anything else through the encoder."""
    if value is None:
        return "null"
    if type(value) is str:
        return _quote(value)
    if type(value) is int:
        return str(value)
    return _ROW.encode(value)


_KINDS = {kind: _quote(str(kind)) for kind in Kind}  # each kind as JSON text, made once


def _kind(kind: Kind) -> str:
    """Return ``kind`` as JSON text (a str that is no ``Kind`` too)."""
    return _KINDS.get(kind) or _quote(str(kind))


_SUBJECT_COLUMNS = frozenset({"op", "msg", "stage", "dest", "partition", "offset"})
_SHARED_MAX = 256  # details ``LedgerWriter.shared`` remembers
_PLAIN = (str, int, bool)  # value types whose equal values are always written alike (not 0.0 and -0.0)


def _detail_text(detail: dict[str, Any]) -> str:
    """Return the ``detail`` column's JSON text: the detail as sorted JSON, quoted as a string."""
    return _quote(dumps_sorted(detail)) if detail else _EMPTY_DETAIL


class Detail:
    """An event's detail as ``LedgerWriter`` writes it, formatted once for the events that share it."""

    __slots__ = ("text",)

    def __init__(self, /, **detail: Any) -> None:
        self.text = _detail_text(detail)

    @classmethod
    def of_text(cls, text: str) -> Detail:
        """Return the detail whose column text (quoted JSON, as ``Detail`` makes it) is ``text``."""
        made = cls.__new__(cls)
        made.text = text
        return made


_SLOT = "\x00txchaos-slot-{}\x00"  # stands for a varying value while a ``DetailForm`` is built


def _scalar(value: object) -> str:
    """Return a whole number, a boolean or None as JSON; refuse anything else (its text may need escaping)."""
    if type(value) is int:  # the most common first: an index, an offset
        return str(value)
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    raise TypeError(f"{value!r}: a DetailForm fills in whole numbers, booleans and None only")


class DetailForm:
    """Details that share their keys and some values, formatted once with blanks for the rest.

    ``DetailForm(("index", "redelivered"), batch=3)(7, False)`` is ``Detail(batch=3, index=7,
    redelivered=False)``, text for text (tests/unit/test_ledger.py holds the two equal), for the
    events a worker writes about every record of a batch: each fills in only its own numbers.
    """

    __slots__ = ("_count", "_template")

    def __init__(self, blanks: tuple[str, ...], /, **fixed: Any) -> None:
        if clash := sorted(set(blanks).intersection(fixed)):
            raise TypeError(f"{', '.join(clash)}: a blank and a fixed value at once")
        text = dumps_sorted(fixed | {name: _SLOT.format(i) for i, name in enumerate(blanks)})
        # Each blank in sorted-key order, and the text around the blanks escaped as the detail
        # column's quoting escapes it: encode_basestring_ascii escapes character by character.
        pieces = re.split(r'"\\u0000txchaos-slot-(\d+)\\u0000"', text)
        order = [int(i) for i in pieces[1::2]]
        if sorted(order) != list(range(len(blanks))):  # a fixed value held a slot's own text
            raise ValueError(f"{fixed!r}: a fixed value of a DetailForm holds the text it marks its blanks with")
        # One str.format template, its fields numbered by blank: a worker fills one in per record of
        # a batch, and building the text piece by piece in Python cost 1.7 us a detail.
        parts = [_quote(piece)[1:-1].replace("{", "{{").replace("}", "}}") for piece in pieces[::2]]
        fields = "".join(f"{{{at}}}{piece}" for at, piece in zip(order, parts[1:], strict=True))
        self._template = f'"{parts[0]}{fields}"'
        self._count = len(blanks)

    def __call__(self, *values: object) -> Detail:
        if len(values) != self._count:
            raise TypeError(f"{len(values)} value(s) for {self._count} blank(s)")
        return Detail.of_text(self._template.format(*map(_scalar, values)))


class Subject:
    """The columns an event shares with the other events about its message (``op`` to ``dest``,
    ``partition`` and ``offset``), as ``LedgerWriter.subject`` takes them.

    Each is formatted as JSON once for all the events about the message (``texts``): a packed row
    takes each value's text, a row of its own the text from ``op`` to the name of ``attempt`` and
    from ``partition`` to the name of ``detail`` (``parts``), made when first needed.
    """

    __slots__ = ("_parts", "dest", "msg", "offset", "op", "partition", "stage", "texts")

    def __init__(
        self,
        op: str | None,
        msg: str | None,
        stage: str | None,
        dest: str | None,
        partition: int | None,
        offset: int | None,
    ) -> None:
        self.op, self.msg, self.stage, self.dest, self.partition, self.offset = op, msg, stage, dest, partition, offset
        # op, msg, partition and offset as JSON text: every event about the message takes them
        self.texts = (_field(op), _field(msg), _field(partition), _field(offset))
        self._parts: tuple[str, str] | None = None

    @property
    def parts(self) -> tuple[str, str]:
        """Return a row's text from ``op`` to the name of ``attempt``, and from ``partition`` to the
        name of ``detail``."""
        if self._parts is None:
            op, msg, partition, offset = self.texts
            self._parts = (
                f',"op":{op},"msg":{msg},"stage":{_field(self.stage)},"dest":{_field(self.dest)},"attempt":',
                f',"partition":{partition},"offset":{offset},"detail":',
            )
        return self._parts


class _About:
    """An event ``emit_about`` made inside a batch, formatted when the batch is written: a run of
    them alike (``_runs``) goes as one packed row."""

    __slots__ = ("attempt", "info", "kind", "point", "seq", "subject", "ts")

    def __init__(
        self, kind: Kind, subject: Subject, attempt: int | None, point: str | None, info: str, seq: int, ts: int
    ) -> None:
        self.kind, self.subject, self.attempt, self.point, self.info, self.seq, self.ts = (
            kind,
            subject,
            attempt,
            point,
            info,
            seq,
            ts,
        )


_ABOUT_BYTES = 200  # what a held ``_About`` counts towards ``BATCH_BYTES`` (an event's row is about as long)


class _Held:
    """The rows a batch holds (written, or events to format) and about their size in bytes."""

    def __init__(self) -> None:
        self.rows: list[bytes | _About] = []
        self.size = 0


def _runs(rows: list[bytes | _About]) -> Iterator[bytes | list[_About]]:
    """Yield a batch's rows in order, its held events grouped in runs that one packed row can hold:
    of one kind, point, stage and destination, their sequence numbers consecutive."""
    run: list[_About] = []
    for row in rows:
        if isinstance(row, bytes):
            if run:
                yield run
                run = []
            yield row
            continue
        if run:
            last = run[-1]
            if (
                row.seq == last.seq + 1
                and row.kind == last.kind
                and row.point == last.point
                and row.subject.stage == last.subject.stage
                and row.subject.dest == last.subject.dest
            ):
                run.append(row)
                continue
            yield run
        run = [row]
    if run:
        yield run


class LedgerWriter:
    """Write events for one source into ``<ledger_dir>/segments/<src>-<pid>.jsonl``.

    >>> w = LedgerWriter(run_dir / "ledger", "driver")
    >>> w.emit(Kind.SUBMIT, op="op-1", dest="orders")
    """

    def __init__(self, ledger_dir: Path, src: str) -> None:
        self.src = src
        self._src = _quote(src)
        self.pid = os.getpid()
        seg_dir = ledger_dir / "segments"
        seg_dir.mkdir(parents=True, exist_ok=True)
        self.path = seg_dir / f"{src}-{self.pid}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._seq = 0
        self._lock = threading.Lock()
        self._local = threading.local()  # .held: the rows of this thread's open ``batch``
        self._shared: dict[tuple[object, ...], Detail] = {}

    def subject(
        self,
        *,
        op: str | None = None,
        msg: str | None = None,
        stage: str | None = None,
        dest: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> Subject:
        """Return the columns every event about one message shares, for ``emit_about`` and ``emit_each``."""
        return Subject(op, msg, stage, dest, partition, offset)

    def shared(self, **detail: Any) -> Detail:
        """Return ``Detail(**detail)``, remembered: the same detail again is not formatted again.

        For the events a worker writes about every message with one detail (an effect's table,
        an output's topic); details of other values than text, whole numbers, booleans and None
        are formatted each time, and once ``_SHARED_MAX`` are remembered new ones are not kept.
        """
        key: list[object] = []
        for name, value in detail.items():
            if value is not None and type(value) not in _PLAIN:
                return Detail(**detail)
            key += (name, type(value), value)  # the type: True and 1 are equal keys, not equal text
        found = self._shared.get(k := tuple(key))
        if found is None:
            found = Detail(**detail)
            if len(self._shared) < _SHARED_MAX:
                self._shared[k] = found
        return found

    def emit(
        self,
        kind: Kind,
        *,
        op: str | None = None,
        msg: str | None = None,
        stage: str | None = None,
        dest: str | None = None,
        attempt: int | None = None,
        point: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        **detail: Any,
    ) -> None:
        """Append one event; returns once the kernel holds it."""
        about = self.subject(op=op, msg=msg, stage=stage, dest=dest, partition=partition, offset=offset)
        self._append(kind, about, attempt, point, _detail_text(detail))

    def emit_about(
        self,
        kind: Kind,
        subject: Subject,
        *,
        attempt: int | None = None,
        point: str | None = None,
        shared: Detail | None = None,
        **detail: Any,
    ) -> None:
        """Append one event about ``subject`` (``subject(...)``), exactly as ``emit`` with its columns
        writes it; returns once the kernel holds it.

        For a worker's events about one message (delivered, applied, committed, sent, its offset
        committed): their shared columns are formatted once, not once an event; so is ``shared``,
        a detail many events carry (``Detail``, ``shared``), given instead of ``detail``.
        """
        if detail and not _SUBJECT_COLUMNS.isdisjoint(detail):
            named = sorted(_SUBJECT_COLUMNS.intersection(detail))
            raise TypeError(f"{', '.join(named)}: a column of the event's subject, not a detail")
        if shared is not None and detail:
            raise TypeError(f"{', '.join(sorted(detail))}: give the detail as shared= or as keywords, not both")
        info = shared.text if shared is not None else _detail_text(detail)
        held: _Held | None = getattr(self._local, "held", None)
        if held is None:
            self._append(kind, subject, attempt, point, info)
            return
        with self._lock:
            seq = self._seq
            self._seq += 1
        held.rows.append(_About(kind, subject, attempt, point, info, seq, time.time_ns()))
        held.size += _ABOUT_BYTES
        if held.size >= BATCH_BYTES:
            self._release(held)

    def _line(
        self, ts: int, seq: int, kind: Kind, subject: Subject, attempt: int | None, point: str | None, info: str
    ) -> str:
        """Return one event's row of its own. It is formatted field by field, in COLUMNS order and
        exactly as ``_ROW.encode`` of the row dict would write it (a test holds the two equal): a
        worker writes four or five events a message, and the generic encoder of a dict was most of
        an event's cost."""
        head, tail = subject.parts
        return (
            f'{{"ts_ns":{ts},"src":{self._src},"pid":{self.pid},"seq":{seq},"kind":{_kind(kind)}'
            f'{head}{_field(attempt)},"point":{_field(point)}{tail}{info}}}\n'
        )

    def _append(self, kind: Kind, subject: Subject, attempt: int | None, point: str | None, info: str) -> None:
        with self._lock:
            data = self._line(time.time_ns(), self._seq, kind, subject, attempt, point, info).encode()
            self._seq += 1
            held: _Held | None = getattr(self._local, "held", None)
            if held is None:
                self._write(data)
                return
        self._hold(held, data)

    def emit_each(
        self,
        kind: Kind,
        subjects: Sequence[Subject],
        *,
        shared: Detail | None = None,
        details: Sequence[Detail] | None = None,
        attempts: Sequence[int | None] | None = None,
    ) -> None:
        """Append one ``kind`` event per subject, the ``i``-th the event ``emit_about(kind,
        subjects[i], attempt=attempts[i], shared=details[i] or shared)`` writes; the events share
        one ``ts_ns`` and are one write (or join the open ``batch``).

        For the events a worker writes about every record of a batch: they go as packed rows
        (``schema.PACKED_COLUMNS``) of at most ``PACK_EVENTS`` events, each column's values one JSON
        list (encoded in C) or one value when all events share it. Subjects of more than one stage
        or destination go a row each.
        """
        n = len(subjects)
        if shared is not None and details is not None:
            raise TypeError("give the details as shared= or as details=, not both")
        if details is not None:
            infos = [d.text for d in details]
        else:
            infos = [shared.text if shared is not None else _EMPTY_DETAIL] * n
        tries: list[int | None] = [None] * n if attempts is None else list(attempts)
        if not len(infos) == len(tries) == n:
            raise ValueError(f"{n} subjects, {len(infos)} details and {len(tries)} attempts: one each")
        if not n:
            return
        stage, dest = subjects[0].stage, subjects[0].dest
        alike = n > 1 and all(s.stage == stage and s.dest == dest for s in subjects)
        with self._lock:
            first = self._seq
            self._seq += n
            ts = time.time_ns()
            if alike:
                data = self._packed(ts, first, kind, None, subjects, tries, infos).encode()
            else:
                data = "".join(
                    [
                        self._line(ts, seq, kind, s, a, None, i)
                        for seq, s, a, i in zip(range(first, first + n), subjects, tries, infos, strict=True)
                    ]
                ).encode()
            held: _Held | None = getattr(self._local, "held", None)
            if held is None:
                self._write(data)
                return
        self._hold(held, data)

    def emit_ops(self, kind: Kind, ops: Iterable[str], *, dest: str | None = None) -> None:
        """Append one ``kind`` event per operation in ``ops``, each the event ``emit(kind, op=op,
        dest=dest)`` writes, as packed rows of ``PACK_EVENTS`` events (a row's events share their
        ``ts_ns``).

        For the books' snapshots at the close and the driver's submissions: a million-operation
        soak's effect table is a million rows, and a packed row costs an event little more than its
        op's text. Inside a ``batch`` the rows join what it holds; outside one each is one write.
        """
        fixed = f',"kind":{_kind(kind)},"dest":{_field(dest)},"detail":{_EMPTY_DETAIL},"n":'
        rows = iter(ops)
        while chunk := list(itertools.islice(rows, PACK_EVENTS)):
            with self._lock:
                first = self._seq
                self._seq += len(chunk)
            data = (
                f'{{"ts_ns":{time.time_ns()},"src":{self._src},"pid":{self.pid},"seq":{first}'
                f'{fixed}{len(chunk)},"ops":{_list(chunk)}}}\n'
            ).encode()
            held: _Held | None = getattr(self._local, "held", None)
            if held is None:
                with self._lock:
                    self._write(data)
            else:
                self._hold(held, data)

    def _packed(
        self,
        ts: int,
        first: int,
        kind: Kind,
        point: str | None,
        subjects: Sequence[Subject],
        tries: Sequence[int | None],
        infos: Sequence[str],
    ) -> str:
        """Return packed rows (``schema.PACKED_COLUMNS``) of at most ``PACK_EVENTS`` events for
        ``subjects`` (of one stage and destination), the first with sequence number ``first``."""
        fixed = (
            f',"kind":{_kind(kind)},"stage":{_field(subjects[0].stage)},"dest":{_field(subjects[0].dest)},'
            f'"point":{_field(point)},"n":'
        )
        head = f'{{"ts_ns":{ts},"src":{self._src},"pid":{self.pid},"seq":'
        rows = []
        for lo in range(0, len(subjects), PACK_EVENTS):
            part = subjects[lo : lo + PACK_EVENTS]
            hi = lo + len(part)
            ops, msgs, partitions, offsets = zip(*[s.texts for s in part], strict=True)
            attempts = tries[lo:hi]
            unknown = attempts.count(None) == len(attempts)  # most often: no text made for each
            columns = (
                _column("op", ops),
                _column("msg", msgs),
                _column("partition", partitions),
                _column("offset", offsets),
                '"attempt":null' if unknown else _column("attempt", list(map(_field, attempts))),
                _column("detail", infos[lo:hi]),
            )
            rows.append(f"{head}{first + lo}{fixed}{len(part)},{','.join(columns)}}}\n")
        return "".join(rows)

    def _formatted(self, rows: list[bytes | _About]) -> bytes:
        """Return a batch's held rows as bytes: each run of held events alike (``_runs``) as packed rows."""
        out: list[bytes] = []
        for run in _runs(rows):
            if isinstance(run, bytes):
                out.append(run)
            elif len(run) == 1:
                e = run[0]
                out.append(self._line(e.ts, e.seq, e.kind, e.subject, e.attempt, e.point, e.info).encode())
            else:
                e = run[0]
                subjects = [a.subject for a in run]
                tries = [a.attempt for a in run]
                out.append(self._packed(e.ts, e.seq, e.kind, e.point, subjects, tries, [a.info for a in run]).encode())
        return b"".join(out)

    def _hold(self, held: _Held, data: bytes) -> None:
        """Add ``data`` to this thread's open batch; write what it holds once that is ``BATCH_BYTES``."""
        held.rows.append(data)
        held.size += len(data)
        if held.size >= BATCH_BYTES:
            self._release(held)

    def _write(self, data: bytes) -> None:
        written = os.write(self._fd, data)
        if written != len(data):  # regular files never short-write short of ENOSPC
            raise OSError(f"short ledger write to {self.path}: {written} of {len(data)} bytes")

    def _release(self, held: _Held) -> None:
        """Write a batch's held rows in one call."""
        rows, held.rows, held.size = held.rows, [], 0
        if rows:
            data = self._formatted(rows)
            with self._lock:
                self._write(data)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the events emitted inside the block and write them in one call when it ends.

        For a loop that writes an event per record of a batch with nothing between them that
        must be on disk first (no commit; a crash point ``flush``-es before it kills): the block
        returns once the kernel holds them all, one system call instead of hundreds. A kill from
        outside loses what the block holds, as if it had come before the block. A batch is its
        thread's: other threads' events are written as they come (a file then holds seqs out of
        order; readers sort by them). Blocks do not nest.
        """
        if getattr(self._local, "held", None) is not None:
            raise RuntimeError("ledger batches do not nest")
        held = self._local.held = _Held()
        try:
            yield
        finally:
            self._local.held = None
            self._release(held)

    def flush(self) -> None:
        """Write what this thread's open batch holds so far (nothing outside a batch): before the
        process stops itself at a crash point, so what it recorded survives the kill."""
        held: _Held | None = getattr(self._local, "held", None)
        if held is not None:
            self._release(held)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
