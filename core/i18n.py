"""Sentences built in Python that a note prints, kept translatable: ``N_`` marks an English
message for the catalogue (report/locale, extracted by ``python -m report.i18n update`` from
every package), ``Message`` is the sentence built from it with its parameters and
``MessageList`` a list of them.

Here, below the stages, so that ingest and runner can word a sentence the note prints without
importing report. Deliberately not here: the catalogues, the languages and the translation
itself (report.i18n).
"""
from __future__ import annotations

from typing import Any


def N_(message: str) -> str:  # noqa: N802 - the gettext convention
    """Marks an English message in Python for extraction; the template translates it when it
    prints it (``{{ _(value) }}``). Returns the message unchanged."""
    return message


class Message(str):
    """English text built in Python from a marked message and parameters, printable translated.

    The str value is the English sentence (``msgid % params``: what tests, logs and summary.json
    see); ``msgid`` (marked ``N_`` where it is written) and ``params`` let a template's ``_(value)``
    print it in the note's language (report.render translates ``msgid`` and every parameter that
    is a Message or MessageList itself; other parameters are data and print as they are)."""

    msgid: str
    params: dict[str, Any]

    def __new__(cls, msgid: str, /, **params: Any) -> "Message":
        self = super().__new__(cls, msgid % {k: str(v) for k, v in params.items()})
        self.msgid, self.params = msgid, params
        return self

    def __reduce__(self):
        return _message, (self.msgid, self.params)

    def __deepcopy__(self, memo: dict) -> "Message":
        return self  # immutable


def _message(msgid: str, params: dict[str, Any]) -> Message:
    return Message(msgid, **params)


class MessageList(str):
    """Items (Messages or data) joined by a list separator (``", "`` or ``"; "``), translated
    item by item with the language's separator (``pgettext("list separator", sep)``)."""

    items: tuple[Any, ...]
    sep: str

    def __new__(cls, items: Any, sep: str = ", ") -> "MessageList":
        items = tuple(items)
        self = super().__new__(cls, sep.join(str(i) for i in items))
        self.items, self.sep = items, sep
        return self

    def __reduce__(self):
        return MessageList, (self.items, self.sep)

    def __deepcopy__(self, memo: dict) -> "MessageList":
        return self
