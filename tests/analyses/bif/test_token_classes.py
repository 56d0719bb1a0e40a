"""Token classes on hand-written text with a tiny local tokenizer (no hub)."""

from __future__ import annotations

import pytest
import torch

from interp_toolkit.analyses.bif.token_classes import (
    regex_class,
    token_classes,
    tokenize_documents,
)
from interp_toolkit.errors import UserError

DOCS = [
    # 0     1 2   3 4   5 6 7  8 9 10 11  -> nested ( [ ] ), an unmatched ), a brace left open
    "the ( cat [ sat ] ) on ) mat { end",
    # 0 1 2 3 4 5 6 7 8 9 10  -> bigram "a b" repeats (length 1), "p q r" repeats (longer)
    "a b x a b p q r y p q r",
    # straight quotes alternate; a lone repeated token is not a bigram repeat
    'he said " hi " and " yo " z z',
]


def make_tokenizer(docs):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for d in docs for w in d.split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", "<eos>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>")


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer(DOCS + ["m n o"])


def rows_of(classes, name, row):
    return [j for r, j in classes.positions(name) if r == row]


def test_hand_written_positions(tokenizer):
    text = tokenize_documents(DOCS[:1], tokenizer, 12, pack=False)
    c = token_classes(text, tokenizer)
    assert rows_of(c, "open", 0) == [1, 3, 10]
    assert rows_of(c, "close", 0) == [5, 6, 8]  # nested ] ) and the unmatched ) too
    assert rows_of(c, "induction", 0) == [] and rows_of(c, "induction_trigger", 0) == []

    text = tokenize_documents(DOCS[1:2], tokenizer, 12, pack=False)
    c = token_classes(text, tokenizer)
    # second b (4); second q, r (10, 11); their triggers a (3), p (9), q (10)
    assert rows_of(c, "induction", 0) == [4, 10, 11]
    assert rows_of(c, "induction_trigger", 0) == [3, 9, 10]
    labels = c.labels()[0].tolist()
    names = c.names
    assert [names[i] for i in labels[9:12]] == ["induction_trigger", "induction", "induction"]
    assert names[labels[0]] == "other"

    text = tokenize_documents(DOCS[2:3], tokenizer, 10, pack=False)
    c = token_classes(text, tokenizer)
    assert rows_of(c, "open", 0) == [2, 6] and rows_of(c, "close", 0) == [4, 8]
    assert rows_of(c, "induction", 0) == []  # "z z" is one bigram, seen once


def test_repeats_across_sequence_boundaries_not_counted(tokenizer):
    # one document cut into two rows of 3: "m n o | m n o" -> the second row's "m n" is no repeat
    packed = tokenize_documents(["m n o m n o"], tokenizer, 3, pack=True)  # + <eos>, dropped
    assert packed.tokens.shape == (2, 3)
    assert not token_classes(packed, tokenizer).masks["induction"].any()
    # two documents packed into one row: the repeat spans documents, not counted
    two_docs = tokenize_documents(["m n", "m n"], tokenizer, 6, pack=True)  # m n <eos> m n <eos>
    assert two_docs.tokens.shape == (1, 6)
    assert not token_classes(two_docs, tokenizer).masks["induction"].any()
    one_doc = tokenize_documents(["m n <eos> m n"], tokenizer, 5, pack=False)
    assert rows_of(token_classes(one_doc, tokenizer), "induction", 0) == [4]


def test_dataset_and_list_give_same_classes(tokenizer, tmp_path):
    from datasets import Dataset

    from_list = token_classes(tokenize_documents(DOCS, tokenizer, 8), tokenizer)
    from_text = token_classes(tokenize_documents(Dataset.from_dict({"text": DOCS}), tokenizer, 8), tokenizer)
    ids = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in DOCS]
    from_ids = token_classes(tokenize_documents(Dataset.from_dict({"input_ids": ids}), tokenizer, 8), tokenizer)
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(DOCS) + "\n")
    from_file = token_classes(tokenize_documents(path, tokenizer, 8), tokenizer)
    assert from_list.tokens.shape[0] == 4  # 39 tokens + 3 <eos> packed into rows of 8
    for other in (from_text, from_file):
        assert torch.equal(other.tokens, from_list.tokens)
        assert all(torch.equal(other.masks[k], from_list.masks[k]) for k in from_list.masks)
    # packed input_ids get the same <eos> separators from the tokenizer
    assert torch.equal(from_ids.tokens, from_list.tokens)


def test_user_classes_ids_and_predicate(tokenizer):
    text = tokenize_documents(DOCS[1:2], tokenizer, 12, pack=False)
    a_id = tokenizer.convert_tokens_to_ids("a")
    c = token_classes(text, tokenizer, user_classes={"a_tok": [a_id], "pqr": regex_class("[pqr]"),
                                                     "len1": lambda i, t: t.strip() == "x"})
    assert rows_of(c, "a_tok", 0) == [0, 3]
    assert rows_of(c, "pqr", 0) == [5, 6, 7, 9, 10, 11]
    assert rows_of(c, "len1", 0) == [2]
    assert c.names[: 3] == ["a_tok", "pqr", "len1"]
    ts = c.token_set()
    assert ts.classes.shape == (1, 11) and ts.class_names == c.names
    assert c.names[int(ts.classes[0, 2])] == "a_tok"  # position 3 ('a') beats induction_trigger


def test_bad_input_named(tokenizer):
    with pytest.raises(UserError, match="seq_len"):
        tokenize_documents(DOCS, tokenizer, 1)
    with pytest.raises(UserError, match="no row of seq_len 500"):
        tokenize_documents(DOCS, tokenizer, 500)
    with pytest.raises(UserError, match="does not exist"):
        tokenize_documents("/nonexistent/file.txt", tokenizer, 4)
    with pytest.raises(UserError, match="'input_ids' column"):
        from datasets import Dataset

        tokenize_documents(Dataset.from_dict({"body": DOCS}), tokenizer, 4)
    with pytest.raises(UserError, match="collection of token ids or a predicate"):
        token_classes(torch.zeros(1, 4, dtype=torch.long), tokenizer, user_classes={"bad": "abc"})
    with pytest.raises(UserError, match="not a valid regular expression"):
        regex_class("(")
