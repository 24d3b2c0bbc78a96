"""Examples -> overlapping token windows ("features") with answer labels, cached on disk.

Each unique context is tokenised once and windows are cut from its tokens, instead of
re-tokenising the context with every one of its questions as `tokenizer(q, c, stride=...)` does:
SQuAD has ~4.6 questions per context, so this is most of the featurisation time saved.
Windows follow the tokenizer's overflow semantics: `max_ctx` context tokens each, consecutive
windows sharing `doc_stride` tokens.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qa_train.config.settings import ConfigError
from qa_train.data.load import DataError, Examples

# As in the original BERT SQuAD recipe: a longer question is cut so the context keeps its room.
MAX_QUERY_LENGTH = 64
CACHE_VERSION = "4"  # 4: answer labels from the tokens the answer overlaps; questions cut to the window's room
log = logging.getLogger("qa_train")


@dataclass
class PairTemplate:
    """Where the special tokens go around (question, context) for this tokenizer's model family."""

    prefix: np.ndarray
    middle: np.ndarray
    suffix: np.ndarray
    type_question: int
    type_context: int
    cls_index: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> PairTemplate:
        enc = tokenizer("q", "c", add_special_tokens=True)
        seq = enc.sequence_ids()
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        q_pos = [i for i, s in enumerate(seq) if s == 0]
        c_pos = [i for i, s in enumerate(seq) if s == 1]
        types = enc.get("token_type_ids") or [0] * len(ids)
        cls_id = tokenizer.cls_token_id
        prefix = ids[: q_pos[0]]
        _check_layout(tokenizer, ids, prefix)
        return cls(
            prefix=prefix,
            middle=ids[q_pos[-1] + 1 : c_pos[0]],
            suffix=ids[c_pos[-1] + 1 :],
            type_question=types[q_pos[0]],
            type_context=types[c_pos[0]],
            cls_index=int(np.flatnonzero(prefix == cls_id)[0]) if cls_id in prefix else 0,
        )

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.middle) + len(self.suffix)


def _check_layout(tokenizer, pair_ids: np.ndarray, prefix: np.ndarray) -> None:
    """Refuse what the windows cannot hold: they put the classifier token (the v2.0 null answer) before
    the question and padding after the context; XLNet has its <cls> last and pads on the left."""
    cls_id = tokenizer.cls_token_id
    unsupported = []
    if cls_id is not None and cls_id in pair_ids and cls_id not in prefix:
        unsupported.append("a classifier token after the question")
    if getattr(tokenizer, "padding_side", "right") != "right":
        unsupported.append(f"padding_side={tokenizer.padding_side!r}")
    if unsupported:
        # No flag named: the folder may be --tokenizer_name's, --model_name_or_path's or predict's MODEL_DIR, which
        # load_tokenizer's caller (modeling.loading) puts in front.
        raise ConfigError(
            f"its tokenizer ({type(tokenizer).__name__}) has {' and '.join(unsupported)}, which qa_train does not "
            "support: it needs the classifier token first and padding on the right"
        )


@dataclass
class Features:
    """Ragged windows in flat arrays: window i is input_ids[row_start[i]:row_start[i+1]]."""

    input_ids: np.ndarray  # int32 [total_tokens]
    token_type_ids: np.ndarray  # int8 [total_tokens]
    row_start: np.ndarray  # int64 [F + 1]
    example_index: np.ndarray  # int32 [F]
    context_offset: np.ndarray  # int32 [F]: position of the window's first context token in the window
    context_span: np.ndarray  # int32 [F, 2]: [first, end) context token indices of the window
    start_positions: np.ndarray  # int32 [F]: cls_index when the answer is not wholly inside
    end_positions: np.ndarray  # int32 [F]
    cls_index: np.ndarray  # int32 [F]: the CLS token, where "no answer" is labelled and read (SQuAD v2.0)
    # int32 [total_tokens, 2]: character span of each context token in its context, (-1, -1) for question
    # and special tokens. Evaluation only (post-processing reads answers through it); None for training.
    offsets: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.example_index)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.row_start)

    def save(self, path: Path) -> None:
        """Atomic: write a temporary file in the same folder, then rename; a killed run leaves no partial cache."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".tmp.npz")
        try:
            # No fsync: after a power loss a damaged cache is detected on load and rebuilt.
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **{k: v for k, v in self.__dict__.items() if v is not None})
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> Features:
        """Raises what numpy raises for a damaged file, or ValueError when its arrays do not fit together."""
        with np.load(path, allow_pickle=False) as z:
            features = cls(**{k: z[k] for k in z.files})
        features._check_shapes()
        return features

    def _check_shapes(self) -> None:
        """Cheap consistency of the arrays' lengths: catches a damaged file whose zip checks passed."""
        n, total = len(self.example_index), len(self.input_ids)
        expected = {
            "token_type_ids": (total,),
            "row_start": (n + 1,),
            "context_offset": (n,),
            "context_span": (n, 2),
            "start_positions": (n,),
            "end_positions": (n,),
            "cls_index": (n,),
        }
        if self.offsets is not None:
            expected["offsets"] = (total, 2)
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
        if self.row_start[0] != 0 or self.row_start[-1] != total:
            raise ValueError(f"row_start runs {self.row_start[0]}..{self.row_start[-1]}, expected 0..{total}")


def _char_to_token(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last context tokens that overlap [start_char, end_char); None when none does (the answer is
    made of characters the tokenizer drops). Overlap rather than "the token holding each end": an answer
    that begins or ends with a space, NBSP or zero-width character would otherwise take in the next word."""
    start = int(np.searchsorted(offsets[:, 1], start_char, side="right"))  # first token ending after start_char
    end = int(np.searchsorted(offsets[:, 0], end_char, side="left")) - 1  # last token starting before end_char
    return (start, end) if start <= end else None


def question_room(tpl: PairTemplate, max_seq_length: int, doc_stride: int) -> int:
    """Most question tokens a window holds: MAX_QUERY_LENGTH, or fewer where the context would otherwise keep
    no more than --doc_stride tokens per window (windows could not advance). Refuses flags that leave none."""
    room = min(MAX_QUERY_LENGTH, max_seq_length - tpl.num_special - doc_stride - 1)
    if room < 1:
        raise ConfigError(
            f"--doc_stride {doc_stride}: with --max_seq_length {max_seq_length} and this tokenizer's "
            f"{tpl.num_special} special tokens a window has no room for the question; use --doc_stride "
            f"at most {max_seq_length - tpl.num_special - 2}"
        )
    return room


# Texts go to the tokenizer in chunks: one call over all of SQuAD's contexts holds every offset as a Python tuple
# at once, far above the int32 arrays they end as (docs/benchmarks/2026-11-22-cpu-data-and-host-memory.md).
TOKENIZE_CHUNK = 2048


def tokenize_texts(tokenizer, texts: list[str], offsets: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token ids (and character offsets when asked) of each text, without special tokens, as int32 arrays."""
    ids: list[np.ndarray] = []
    offs: list[np.ndarray] = []
    for k in range(0, len(texts), TOKENIZE_CHUNK):
        # verbose=False: contexts longer than the model's positions are expected (they are cut into windows);
        # transformers would warn that they "will result in indexing errors".
        enc = tokenizer(
            texts[k : k + TOKENIZE_CHUNK],
            add_special_tokens=False,
            return_offsets_mapping=offsets,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        ids.extend(np.asarray(x, dtype=np.int32) for x in enc["input_ids"])
        if offsets:
            offs.extend(np.asarray(x, dtype=np.int32).reshape(-1, 2) for x in enc["offset_mapping"])
    return ids, offs


def featurize(
    examples: Examples, tokenizer, max_seq_length: int, doc_stride: int, with_offsets: bool = False
) -> Features:
    """Cut every question's context into windows; label the first gold answer (train and eval alike).

    A window that does not hold the whole answer, and every window of an unanswerable (SQuAD v2.0)
    question, is labelled at the CLS token, as transformers' run_qa does.

    `with_offsets` keeps each window's character offsets, which evaluation needs and training does not.
    """
    tpl = PairTemplate.from_tokenizer(tokenizer)
    room = question_room(tpl, max_seq_length, doc_stride)
    unique: dict[str, int] = {}
    ctx_index = np.asarray([unique.setdefault(c, len(unique)) for c in examples.contexts], dtype=np.int64)
    ctx_ids, ctx_offs = tokenize_texts(tokenizer, list(unique), offsets=True)
    q_ids, _ = tokenize_texts(tokenizer, [q.lstrip() for q in examples.questions], offsets=False)
    _check_tokens(examples, tokenizer, q_ids, [len(ctx_ids[c]) for c in ctx_index])
    _report_cut_questions(examples, q_ids, room, max_seq_length, doc_stride)

    pieces: list[np.ndarray] = []
    types: list[np.ndarray] = []
    spans: list[np.ndarray] = []
    no_span = np.full((max_seq_length, 2), -1, dtype=np.int32)
    meta: list[tuple[int, int, int, int, int, int]] = []
    for i, question in enumerate(q_ids):
        q = question[:room]
        c, off = ctx_ids[ctx_index[i]], ctx_offs[ctx_index[i]]
        max_ctx = max_seq_length - len(q) - tpl.num_special  # > doc_stride, as question_room leaves it
        head = np.concatenate([tpl.prefix, q, tpl.middle])
        head_types = np.full(len(head), tpl.type_question, dtype=np.int8)
        tail_types = np.full(max_ctx + len(tpl.suffix), tpl.type_context, dtype=np.int8)
        ans_tok = _answer_tokens(examples, i, off, tokenizer)
        start = 0
        while True:
            end = min(start + max_ctx, len(c))
            pieces.append(np.concatenate([head, c[start:end], tpl.suffix]))
            types.append(np.concatenate([head_types, tail_types[: end - start + len(tpl.suffix)]]))
            if with_offsets:
                spans.append(np.concatenate([no_span[: len(head)], off[start:end], no_span[: len(tpl.suffix)]]))
            s_pos = e_pos = tpl.cls_index
            if ans_tok is not None and start <= ans_tok[0] and ans_tok[1] < end:
                s_pos, e_pos = len(head) + ans_tok[0] - start, len(head) + ans_tok[1] - start
            meta.append((i, len(head), start, end, s_pos, e_pos))
            if end >= len(c):
                break
            start += max_ctx - doc_stride
    meta_arr = np.asarray(meta, dtype=np.int64).reshape(-1, 6)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    return Features(
        input_ids=np.concatenate(pieces).astype(np.int32, copy=False),
        token_type_ids=np.concatenate(types),
        row_start=np.concatenate([[0], np.cumsum(lengths)]),
        example_index=meta_arr[:, 0].astype(np.int32),
        context_offset=meta_arr[:, 1].astype(np.int32),
        context_span=meta_arr[:, 2:4].astype(np.int32),
        start_positions=meta_arr[:, 4].astype(np.int32),
        end_positions=meta_arr[:, 5].astype(np.int32),
        cls_index=np.full(len(meta_arr), tpl.cls_index, dtype=np.int32),
        offsets=np.concatenate(spans) if with_offsets else None,
    )


def _tokenizer_name(tokenizer) -> str:
    return f"--tokenizer_name {tokenizer.name_or_path!r}" if tokenizer.name_or_path else "the tokenizer"


def _check_tokens(examples: Examples, tokenizer, q_ids: list[np.ndarray], ctx_lengths: list[int]) -> None:
    """A question or context the tokenizer turns into no tokens at all (e.g. only U+FFFD, which BERT's
    normaliser deletes) would train as an empty window: refuse it, naming the first one."""
    for what, lengths in (("question", [len(q) for q in q_ids]), ("context", ctx_lengths)):
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if empty:
            i = empty[0]
            raise DataError(
                f"{examples.source}: question {examples.ids[i]}: the {what} tokenises to nothing: "
                f"{_tokenizer_name(tokenizer)} drops every character of it ({len(empty)} question(s) "
                "like this)"
            )


def _answer_tokens(examples: Examples, i: int, offsets: np.ndarray, tokenizer) -> tuple[int, int] | None:
    """The first gold answer's [first, last] context tokens; None for an unanswerable question."""
    if not examples.answer_texts[i]:
        return None
    text, s_char = examples.answer_texts[i][0], examples.answer_starts[i][0]
    tokens = _char_to_token(offsets, s_char, s_char + len(text))
    if tokens is None:
        raise DataError(
            f"{examples.source}: question {examples.ids[i]}: answer {text!r} at character {s_char} "
            f"covers no token: {_tokenizer_name(tokenizer)} drops every character of it"
        )
    return tokens


def _report_cut_questions(
    examples: Examples, q_ids: list[np.ndarray], room: int, max_seq_length: int, doc_stride: int
) -> None:
    """Long questions are cut, as BERT's max_query_length does; a warning when the window, not that limit,
    is what cuts them (small --max_seq_length or large --doc_stride), as the model then reads less of them."""
    cut = sum(len(q) > room for q in q_ids)
    if not cut:
        return
    if room < MAX_QUERY_LENGTH:
        log.warning(
            "%s: %d question(s) cut to their first %d tokens: --max_seq_length %d less --doc_stride %d "
            "leaves no more room",
            examples.source,
            cut,
            room,
            max_seq_length,
            doc_stride,
        )
    else:
        log.info(
            "%s: %d question(s) cut to their first %d tokens (as BERT's max_query_length)", examples.source, cut, room
        )


def window_offsets(features: Features, width: int) -> np.ndarray:
    """[F, width, 2] character offsets of each window's tokens, (-1, -1) for non-context and padding.

    Read from the offsets featurisation kept (`with_offsets=True`): the contexts are not tokenised again.
    """
    if features.offsets is None:
        raise ValueError("these features were cut without character offsets; featurize(..., with_offsets=True)")
    lengths = features.lengths
    rows = np.repeat(np.arange(len(features)), lengths)
    cols = np.arange(len(features.input_ids)) - np.repeat(features.row_start[:-1], lengths)
    out = np.full((len(features), width, 2), -1, dtype=np.int32)
    out[rows, cols] = features.offsets
    return out


def cache_key(examples: Examples, tokenizer, max_seq_length: int, doc_stride: int, with_offsets: bool) -> str:
    vocab = tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else str(len(tokenizer))
    h = hashlib.sha256()
    for part in (
        CACHE_VERSION,
        examples.fingerprint,
        str(len(examples)),
        hashlib.sha256(vocab.encode()).hexdigest(),
        str(max_seq_length),
        str(doc_stride),
        str(with_offsets),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    # An empty QA_TRAIN_CACHE means unset: Path("") would put the cache in whatever folder the run started in.
    return Path(os.environ.get("QA_TRAIN_CACHE") or Path.home() / ".cache" / "qa_train") / "features"


# What np.load and Features(...) raise for a cache file that is truncated or damaged, found by flipping
# every bit of a small cache and truncating it at every byte: zipfile.BadZipFile, EOFError, ValueError
# (bad .npy header, our shape check), TypeError (missing or unknown arrays), RuntimeError (a flipped
# zip flag: "encrypted", NotImplementedError "compression method"), OSError; zlib.error for compressed ones.
_UNREADABLE_CACHE = (OSError, EOFError, ValueError, KeyError, TypeError, RuntimeError, zipfile.BadZipFile, zlib.error)


def _read_cache(path: Path, with_offsets: bool) -> Features | None:
    """The cached windows, or None (with one warning saying why) when the file cannot be used."""
    try:
        features = Features.load(path)
        if with_offsets and features.offsets is None:
            raise ValueError("it holds no character offsets, which evaluation needs")
        return features
    except _UNREADABLE_CACHE as err:
        reason = f"{type(err).__name__}: {err}".replace("\n", " ")
        log.warning("feature cache %s cannot be used (%s); featurising again and replacing it", path, reason)
        return None


def load_or_featurize(
    examples: Examples,
    tokenizer,
    max_seq_length: int,
    doc_stride: int,
    *,
    fresh_since: float = 0.0,
    with_offsets: bool = False,
) -> tuple[Features, bool]:
    """Reuse cached windows when the data, tokenizer and window settings are the same; returns (features, hit).
    Only a cache written at or after `fresh_since` (a `time.time()`) is reused: inf featurises again and
    replaces it (--overwrite_cache), a moment reuses one another process has replaced since."""
    path = cache_dir() / f"{cache_key(examples, tokenizer, max_seq_length, doc_stride, with_offsets)}.npz"
    if path.is_file() and path.stat().st_mtime >= fresh_since:
        features = _read_cache(path, with_offsets)
        if features is not None:
            return features, True
    features = featurize(examples, tokenizer, max_seq_length, doc_stride, with_offsets)
    try:
        features.save(path)
    except OSError as err:  # a read-only or full cache folder only costs time
        log.warning(
            "feature cache %s could not be written (%s); the next run will featurise again", path, err.strerror or err
        )
    return features, False
