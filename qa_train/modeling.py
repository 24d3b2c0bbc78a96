"""Model and tokenizer construction; FLOPs per token for MFU."""

from __future__ import annotations

from qa_train.config import ModelArgs


def load_tokenizer(args: ModelArgs):
    from transformers import AutoTokenizer

    name = args.tokenizer_name or args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(name, use_fast=True)
    if not tokenizer.is_fast:
        raise ValueError(f"--tokenizer_name {name!r}: a fast tokenizer is needed for offset mappings")
    # transformers 5 can silently build a near-empty vocab from a bad vocab file: every word -> [UNK].
    if len(tokenizer) < 100:
        raise ValueError(f"--tokenizer_name {name!r}: vocabulary has only {len(tokenizer)} tokens; "
                         "check that the folder holds tokenizer.json or a valid vocab.txt")
    return tokenizer


def load_model(args: ModelArgs, tokenizer):
    """Pretrained weights by default; random init from --config_name (offline use, benchmarks)."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    if args.config_name:
        config = AutoConfig.from_pretrained(args.config_name)
        config.vocab_size = max(config.vocab_size, len(tokenizer))
        model = AutoModelForQuestionAnswering.from_config(config, attn_implementation=args.attn_implementation)
    else:
        model = AutoModelForQuestionAnswering.from_pretrained(
            args.model_name_or_path, attn_implementation=args.attn_implementation
        )
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size}")
    return model


def flops_per_token(config, seq_len: int) -> float:
    """Training FLOPs per token: 6 x matmul weights (forward + backward) plus attention scores.

    Embedding lookups do no matmul work and are left out; the QA head is counted. Attention is
    12 * layers * hidden * seq_len per token (QK^T and AV, forward 2 x 2, backward twice that).
    """
    h, layers = config.hidden_size, config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * h)
    per_layer = 4 * h * h + 2 * h * inter  # Q, K, V, output projections + the two MLP matrices
    matmul_params = layers * per_layer + 2 * h  # + QA head
    return 6.0 * matmul_params + 12.0 * layers * h * seq_len
