"""Token classes on any tokenized text: delimiters, induction tokens and user-given classes.

Input text is a list of strings, a text file (one document per non-empty line, as
``datasets.load_dataset("text")`` reads it) or a Hugging Face ``datasets.Dataset`` with a
``text`` column (tokenized by the model's tokenizer) or an ``input_ids`` column (used as
is). :func:`tokenize_documents` turns it into a ``[n, seq_len]`` token tensor plus a
*document id* per position; :func:`token_classes` labels every position.

Classes (a position may be in several; :meth:`TokenClasses.labels` picks one by priority):

* ``open`` / ``close``: delimiters, read off the token's text with surrounding whitespace
  stripped. A token whose text consists only of opening characters ``( [ {`` (or the
  directional quotes ``“ ‘ «``) is ``open``; only closing characters ``) ] }`` (``” ’ »``)
  is ``close``. The classes are lexical, so nesting and balance do not matter: an
  unmatched ``)`` is still ``close``. Straight quotes (``"`` and a lone backtick) have no
  direction: within a document they alternate, the first one opening.
* ``induction``: the second ``B`` of an ``[A][B] ... [A][B]`` repeat, i.e. a position
  ``j`` whose bigram ``(tokens[j-1], tokens[j])`` occurred earlier in the same document and
  the same sequence (row): the token an induction head predicts by copying. Inside a longer
  repeat ``a b c d ... a b c d`` the second ``b``, ``c`` and ``d`` are all induction tokens.
* ``induction_trigger``: the ``[A]`` that triggers it (position ``j - 1``).
* user classes: a collection of token ids or a predicate ``(token_id, token_text) -> bool``.

Repeats are only counted within one row *and* one document: a bigram that recurs in a
later row, or in another document packed into the same row, is not an induction token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence, Union

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from interp_toolkit.config import Config
from interp_toolkit.errors import UserError

__all__ = [
    "BUILTIN_CLASSES",
    "CLOSING_CHARS",
    "DEFAULT_PRIORITY",
    "OPENING_CHARS",
    "TokenClasses",
    "TextClassesConfig",
    "TokenizedText",
    "UserClass",
    "delimiter_masks",
    "induction_masks",
    "load_documents",
    "load_tokenizer",
    "regex_class",
    "token_classes",
    "tokenize_documents",
]

OPENING_CHARS = frozenset("([{“‘«")
CLOSING_CHARS = frozenset(")]}”’»")
STRAIGHT_QUOTES = frozenset('"`')
BUILTIN_CLASSES = ("open", "close", "induction", "induction_trigger")
#: Label order when a position is in several classes: user classes first (in the order
#: given), then these; positions in no class get ``"other"``.
DEFAULT_PRIORITY = ("open", "close", "induction", "induction_trigger")

UserClass = Union[Collection[int], Callable[[int, str], bool]]


@dataclass
class TokenizedText:
    """Rows of token ids and the document each position belongs to.

    Attributes:
        tokens: ``[n, seq_len]`` token ids.
        documents: ``[n, seq_len]`` document index of every position (repeats across
            documents are not induction).
    """

    tokens: Int[Tensor, "n seq"]
    documents: Int[Tensor, "n seq"]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def load_documents(source: Any, text_column: str = "text") -> list[str] | list[list[int]]:
    """Documents from a list of strings, a text file or a ``datasets.Dataset``.

    Returns strings (to tokenize) or lists of token ids (a Dataset's ``input_ids``).

    Raises:
        UserError: Unknown source type, missing file or column, or no documents.
    """
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise UserError(f"text file {str(path)!r} does not exist (expected a UTF-8 file, one document per line)")
        from interp_toolkit.io import read_utf8

        text = read_utf8(path, "a UTF-8 text file, one document per line (--text)", UserError)
        docs: list = [line for line in text.splitlines() if line.strip()]
    elif hasattr(source, "column_names") and hasattr(source, "__getitem__"):  # datasets.Dataset
        columns = list(source.column_names)
        if "input_ids" in columns:
            docs = [[int(t) for t in row] for row in source["input_ids"]]
        elif text_column in columns:
            docs = [str(t) for t in source[text_column]]
        else:
            raise UserError(
                f"dataset has columns {columns}; expected an 'input_ids' column or a {text_column!r} column"
            )
    elif isinstance(source, Sequence) and all(isinstance(d, str) for d in source):
        docs = list(source)
    else:
        raise UserError(
            "text source must be a list of strings, a text file path or a datasets.Dataset, got "
            f"{type(source).__name__}"
        )
    if not docs:
        raise UserError(f"text source {source if isinstance(source, (str, Path)) else type(source).__name__} has no "
                        "documents")
    return docs


def tokenize_documents(
    source: Any,
    tokenizer: Any,
    seq_len: int,
    *,
    pack: bool = True,
    text_column: str = "text",
    max_sequences: int | None = None,
) -> TokenizedText:
    """Tokenize documents into ``[n, seq_len]`` rows.

    Args:
        source: A list of strings, a text file or a ``datasets.Dataset`` (see
            :func:`load_documents`).
        tokenizer: A Hugging Face tokenizer (``tokenizer(text)["input_ids"]``); unused for a
            Dataset with ``input_ids``.
        seq_len: Tokens per row (>= 2).
        pack: ``True``: concatenate the documents (separated by ``tokenizer.eos_token_id``
            when it exists) and cut into rows, dropping the remainder (as LM pretraining
            does); ``False``: one row per document, truncated to ``seq_len``; shorter
            documents are dropped.
        text_column: Text column of a Dataset.
        max_sequences: Keep at most this many rows.

    Raises:
        UserError: Bad ``seq_len`` or too little text for one row.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise UserError(f"seq_len must be an integer >= 2, got {seq_len!r}")
    docs = load_documents(source, text_column)
    if isinstance(docs[0], str):
        if tokenizer is None:
            raise UserError("a tokenizer is needed to tokenize text (pass the model's tokenizer)")
        ids = [list(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
    else:
        ids = docs
    rows: list[list[int]] = []
    doc_rows: list[list[int]] = []
    if pack:
        sep = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
        flat: list[int] = []
        flat_doc: list[int] = []
        for index, d in enumerate(ids):
            flat.extend(d)
            flat_doc.extend([index] * len(d))
            if sep is not None:
                flat.append(int(sep))
                flat_doc.append(index)
        for start in range(0, len(flat) - seq_len + 1, seq_len):
            rows.append(flat[start : start + seq_len])
            doc_rows.append(flat_doc[start : start + seq_len])
    else:
        for index, d in enumerate(ids):
            if len(d) >= seq_len:
                rows.append(list(d[:seq_len]))
                doc_rows.append([index] * seq_len)
    if max_sequences is not None:
        rows, doc_rows = rows[:max_sequences], doc_rows[:max_sequences]
    if not rows:
        total = sum(len(d) for d in ids)
        raise UserError(
            f"text gives no row of seq_len {seq_len} tokens ({len(ids)} documents, {total} tokens, pack={pack}); "
            "use a shorter seq_len or more text"
        )
    return TokenizedText(torch.tensor(rows, dtype=torch.long), torch.tensor(doc_rows, dtype=torch.long))


def _token_texts(tokenizer: Any, ids: Iterable[int]) -> dict[int, str]:
    return {int(i): tokenizer.decode([int(i)]) for i in ids}


def delimiter_masks(
    tokens: Int[Tensor, "n seq"], texts: Mapping[int, str], documents: Int[Tensor, "n seq"] | None = None
) -> tuple[Bool[Tensor, "n seq"], Bool[Tensor, "n seq"]]:
    """``(open, close)`` masks (see the module docstring for the rules)."""
    kind = {}
    for token_id, text in texts.items():
        stripped = text.strip()
        if not stripped:
            continue
        if set(stripped) <= OPENING_CHARS:
            kind[token_id] = "open"
        elif set(stripped) <= CLOSING_CHARS:
            kind[token_id] = "close"
        elif set(stripped) <= STRAIGHT_QUOTES and len(set(stripped)) == 1:
            kind[token_id] = "quote"
    opening = torch.zeros(tokens.shape, dtype=torch.bool)
    closing = torch.zeros(tokens.shape, dtype=torch.bool)
    rows = tokens.tolist()
    docs = documents.tolist() if documents is not None else [[0] * tokens.shape[1]] * tokens.shape[0]
    for r, (row, doc_row) in enumerate(zip(rows, docs)):
        quote_open: dict[tuple[int, str], bool] = {}  # (document, quote text) -> currently open
        for j, (token_id, doc) in enumerate(zip(row, doc_row)):
            k = kind.get(token_id)
            if k == "open":
                opening[r, j] = True
            elif k == "close":
                closing[r, j] = True
            elif k == "quote":
                key = (doc, texts[token_id].strip())
                is_open = quote_open.get(key, False)
                (closing if is_open else opening)[r, j] = True
                quote_open[key] = not is_open
    return opening, closing


def induction_masks(
    tokens: Int[Tensor, "n seq"], documents: Int[Tensor, "n seq"] | None = None
) -> tuple[Bool[Tensor, "n seq"], Bool[Tensor, "n seq"]]:
    """``(induction, induction_trigger)`` masks: repeated bigrams within a row and document."""
    induction = torch.zeros(tokens.shape, dtype=torch.bool)
    trigger = torch.zeros(tokens.shape, dtype=torch.bool)
    docs = documents.tolist() if documents is not None else [[0] * tokens.shape[1]] * tokens.shape[0]
    for r, (row, doc_row) in enumerate(zip(tokens.tolist(), docs)):
        seen: set[tuple[int, int, int]] = set()
        for j in range(1, len(row)):
            if doc_row[j] != doc_row[j - 1]:
                continue
            bigram = (doc_row[j], row[j - 1], row[j])
            if bigram in seen:
                induction[r, j] = True
                trigger[r, j - 1] = True
            else:
                seen.add(bigram)
    return induction, trigger


@dataclass
class TokenClasses:
    """Class membership of every position of a tokenized text.

    Attributes:
        tokens: ``[n, seq_len]`` token ids.
        masks: Class name -> ``[n, seq_len]`` boolean mask (classes may overlap).
        priority: Class order used by :meth:`labels` when a position is in several.
    """

    tokens: Int[Tensor, "n seq"]
    masks: dict[str, Bool[Tensor, "n seq"]]
    priority: tuple[str, ...]

    @property
    def names(self) -> list[str]:
        """Label names of :meth:`labels`: the classes by priority, then ``"other"``."""
        return [*self.priority, "other"]

    def positions(self, name: str) -> list[tuple[int, int]]:
        """``(row, position)`` pairs in class ``name``."""
        if name not in self.masks:
            raise KeyError(f"no token class {name!r}; have {sorted(self.masks)}")
        return [tuple(p) for p in self.masks[name].nonzero().tolist()]

    def labels(self) -> Int[Tensor, "n seq"]:
        """One class id per position (index into :attr:`names`): the first class by
        priority that contains it, else ``"other"``."""
        out = torch.full(self.tokens.shape, len(self.priority), dtype=torch.long)
        for index in reversed(range(len(self.priority))):
            out[self.masks[self.priority[index]]] = index
        return out

    def bif_sets(self, n_posterior: int, n_train: int, n_query: int) -> tuple[Tensor, Any, Any]:
        """Posterior rows (the first ``n_posterior``), recorded training rows (the first
        ``n_train`` of those) and held-out query rows (the next ``n_query``), as
        ``(posterior_tokens, train TokenSet, query TokenSet)``.

        Raises:
            UserError: Bad counts, or fewer rows than ``n_posterior + n_query``.
        """
        for name, value in (("n_posterior", n_posterior), ("n_train", n_train), ("n_query", n_query)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}")
        if n_train > n_posterior:
            raise UserError(f"n_train ({n_train}) must be <= n_posterior ({n_posterior})")
        rows = int(self.tokens.shape[0])
        if rows < n_posterior + n_query:
            raise UserError(
                f"the text gives {rows} sequences, fewer than n_posterior + n_query = {n_posterior + n_query}; "
                "pass more text, a shorter seq_len, or smaller --n-posterior / --n-query"
            )
        return (self.tokens[:n_posterior], self.token_set(slice(0, n_train)),
                self.token_set(slice(n_posterior, n_posterior + n_query)))

    def token_set(self, rows: slice | Tensor | None = None) -> Any:
        """A :class:`~interp_toolkit.analyses.bif.lm.TokenSet` of ``rows``, each loss
        labelled by the class of the token it predicts."""
        from interp_toolkit.analyses.bif.lm_tokens import TokenSet

        index = slice(None) if rows is None else rows
        return TokenSet(self.tokens[index], self.labels()[index][:, 1:], self.names)


def token_classes(
    text: TokenizedText | Int[Tensor, "n seq"],
    tokenizer: Any = None,
    *,
    delimiters: bool = True,
    induction: bool = True,
    user_classes: Mapping[str, UserClass] | None = None,
    priority: Sequence[str] | None = None,
) -> TokenClasses:
    """Label every position of tokenized text with token classes.

    Args:
        text: :func:`tokenize_documents` output, or a ``[n, seq_len]`` token tensor (each
            row one document).
        tokenizer: Decodes token ids to text (delimiters and predicates need it).
        delimiters: Add ``open`` / ``close``.
        induction: Add ``induction`` / ``induction_trigger``.
        user_classes: Name -> token ids, or a predicate ``(token_id, token_text) -> bool``.
        priority: Order of the classes for :meth:`TokenClasses.labels` (default: user
            classes, then :data:`DEFAULT_PRIORITY`).

    Raises:
        UserError: A class name clashes or is empty, a user class is neither ids nor a
            predicate, or a tokenizer is missing where text is needed.
    """
    if isinstance(text, Tensor):
        text = TokenizedText(text.long(), torch.zeros_like(text, dtype=torch.long))
    if not isinstance(text, TokenizedText) or text.tokens.ndim != 2:
        raise UserError(f"text must be a TokenizedText or a [n, seq_len] tensor, got {type(text).__name__}")
    user_classes = dict(user_classes or {})
    for name in user_classes:
        if not isinstance(name, str) or not name or name in (*BUILTIN_CLASSES, "other"):
            raise UserError(f"user token class name {name!r} must be a non-empty string other than "
                            f"{(*BUILTIN_CLASSES, 'other')}")
    needs_text = delimiters or any(callable(c) for c in user_classes.values())
    if needs_text and tokenizer is None:
        raise UserError("token classes need the tokenizer to read token texts (delimiters, predicates)")
    present = sorted({int(t) for t in torch.unique(text.tokens)})
    texts = _token_texts(tokenizer, present) if needs_text else {}
    masks: dict[str, Tensor] = {}
    for name, spec in user_classes.items():
        if callable(spec):
            members = [t for t in present if spec(t, texts[t])]
        elif isinstance(spec, Collection) and not isinstance(spec, (str, bytes)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in spec
        ):
            members = list(spec)
        else:
            raise UserError(f"user token class {name!r} must be a collection of token ids or a predicate, got {spec!r}")
        masks[name] = torch.isin(text.tokens, torch.tensor(members, dtype=torch.long))
    if delimiters:
        masks["open"], masks["close"] = delimiter_masks(text.tokens, texts, text.documents)
    if induction:
        masks["induction"], masks["induction_trigger"] = induction_masks(text.tokens, text.documents)
    default = [*user_classes, *(c for c in DEFAULT_PRIORITY if c in masks)]
    order = tuple(priority) if priority is not None else tuple(default)
    if sorted(order) != sorted(masks):
        raise UserError(f"priority {list(order)} must list each class exactly once: {sorted(masks)}")
    return TokenClasses(text.tokens, masks, order)


def regex_class(pattern: str) -> Callable[[int, str], bool]:
    """A predicate matching token texts (whitespace stripped) by a regular expression."""
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise UserError(f"token class regex {pattern!r} is not a valid regular expression: {err}") from err
    return lambda token_id, text: compiled.fullmatch(text.strip()) is not None


@dataclass
class TextClassesConfig(Config):
    """Where the BIF's text comes from and which token classes to mark (``bif-lm --text``).

    Attributes:
        text: A text file (one document per line) or a directory holding a
            ``datasets.Dataset`` saved with ``save_to_disk`` (``text`` or ``input_ids`` column).
        tokenizer: Local tokenizer directory or Hub name (loaded with ``local_files_only``);
            ``None``: the first checkpoint's directory / Hub name.
        seq_len: Tokens per sequence.
        pack: Concatenate documents and cut rows (``True``) or one row per document.
        text_column: Text column of a Dataset.
        delimiters: Mark ``open`` / ``close`` delimiters.
        induction: Mark ``induction`` / ``induction_trigger`` tokens.
        user_classes: Class name -> token ids.
        user_class_regex: Class name -> regular expression on the token's text (stripped).
    """

    text: str | None = None
    tokenizer: str | None = None
    seq_len: int = 64
    pack: bool = True
    text_column: str = "text"
    delimiters: bool = True
    induction: bool = True
    user_classes: dict[str, list[int]] = field(default_factory=dict)
    user_class_regex: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.text is not None and not isinstance(self.text, str):
            self.text = str(self.text)
        if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise UserError(f"TextClassesConfig.seq_len must be an integer >= 2, got {self.seq_len!r}")
        for name in ("pack", "delimiters", "induction"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"TextClassesConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.user_classes, Mapping) or not all(
            isinstance(ids, (list, tuple))
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
            for ids in self.user_classes.values()
        ):
            raise UserError("TextClassesConfig.user_classes must map names to lists of token ids >= 0, got "
                            f"{self.user_classes!r}")
        if not isinstance(self.user_class_regex, Mapping):
            raise UserError("TextClassesConfig.user_class_regex must map names to regexes, got "
                            f"{self.user_class_regex!r}")
        clash = set(self.user_classes) & set(self.user_class_regex)
        if clash:
            raise UserError(f"token classes {sorted(clash)} are given both as ids and as a regex")
        for pattern in self.user_class_regex.values():
            regex_class(pattern)  # validates

    @classmethod
    def from_file(cls, path: str | Path) -> "TextClassesConfig":
        """Read a JSON or YAML file with these fields (unknown keys are refused by name)."""
        from interp_toolkit.userfiles import read_mapping_file

        return cls.from_dict(read_mapping_file(path, "token-class config"))

    def load_source(self) -> Any:
        """The text file path, or the Dataset saved at ``text``."""
        if self.text is None:
            raise UserError("TextClassesConfig.text is not set (a text file or a saved datasets.Dataset directory)")
        path = Path(self.text)
        if path.is_dir():
            from datasets import load_from_disk

            return load_from_disk(str(path))
        return path

    def classes(self, tokenizer: Any, max_sequences: int | None = None) -> TokenClasses:
        """Tokenize :attr:`text` and mark the configured classes."""
        text = tokenize_documents(self.load_source(), tokenizer, self.seq_len, pack=self.pack,
                                  text_column=self.text_column, max_sequences=max_sequences)
        user: dict[str, UserClass] = {name: list(ids) for name, ids in self.user_classes.items()}
        user.update({name: regex_class(p) for name, p in self.user_class_regex.items()})
        return token_classes(text, tokenizer, delimiters=self.delimiters, induction=self.induction, user_classes=user)


def load_tokenizer(name_or_path: str) -> Any:
    """A Hugging Face tokenizer from a local directory or the local HF cache (no network).

    Raises:
        UserError: Nothing loadable there (the message says how to provide one).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load a tokenizer from {str(name_or_path)!r} offline ({type(err).__name__}); pass --tokenizer DIR "
            "with a tokenizer saved by tokenizer.save_pretrained(DIR)"
        ) from err
