import pytest
import torch

from interp_toolkit.errors import UserError
from interp_toolkit.tasks.induction_corpus import (
    CLASS_NAMES,
    CorpusConfig,
    make_corpus,
    repeated_random_tokens,
    target_classes,
)

torch.set_num_threads(1)


def test_corpus_labels_are_consistent():
    cfg = CorpusConfig(n_sequences=64, seq_len=40, seed=3)
    corpus = make_corpus(cfg)
    assert corpus.tokens.shape == (64, 40) and corpus.classes.shape == (64, 40)
    assert (corpus.tokens[:, 0] == 0).all() and (corpus.classes[:, 0] == CLASS_NAMES.index("bos")).all()
    assert int(corpus.tokens.max()) < cfg.vocab_size
    open_c, close_c, ind = CLASS_NAMES.index("open"), CLASS_NAMES.index("close"), CLASS_NAMES.index("induction")
    for row in range(64):
        stack = []
        for pos in range(1, 40):
            tok, cls = int(corpus.tokens[row, pos]), int(corpus.classes[row, pos])
            if cls == open_c:
                assert tok % 2 == 1 and tok < cfg.first_ordinary
                stack.append(tok)
            elif cls == close_c:
                assert stack and tok == stack.pop() + 1  # closes the innermost open delimiter
            elif cls == ind:
                # an induction token repeats the token that followed an earlier copy of its predecessor
                prev = int(corpus.tokens[row, pos - 1])
                earlier = [p for p in range(1, pos - 1) if int(corpus.tokens[row, p]) == prev
                           and int(corpus.tokens[row, p + 1]) == tok]
                assert earlier
    assert (corpus.classes == ind).sum() >= 64 * (cfg.chunk_min - 1)
    assert (corpus.classes == open_c).any() and (corpus.classes == close_c).any()
    assert target_classes(corpus.classes).shape == (64, 39)
    assert torch.equal(make_corpus(cfg).tokens, corpus.tokens)


def test_corpus_config_validation():
    with pytest.raises(UserError, match="seq_len"):
        CorpusConfig(seq_len=10, chunk_max=10)
    with pytest.raises(UserError, match="p_open"):
        CorpusConfig(p_open=1.5)


def test_repeated_random_tokens():
    toks = repeated_random_tokens(3, 5, 7, 20, seed=1)
    assert toks.shape == (3, 11) and torch.equal(toks[:, 1:6], toks[:, 6:])
