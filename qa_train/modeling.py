"""Model and tokenizer construction; FLOPs per token for MFU."""

from __future__ import annotations

from qa_train.config import ConfigError, ModelArgs


def load_tokenizer(args: ModelArgs):
    from transformers import AutoTokenizer

    name = args.tokenizer_name or args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(name, use_fast=True)
    if not tokenizer.is_fast:
        raise ConfigError(f"--tokenizer_name {name!r}: a fast tokenizer is needed for offset mappings")
    # transformers 5 can silently build a near-empty vocab from a bad vocab file: every word -> [UNK].
    if len(tokenizer) < 100:
        raise ConfigError(f"--tokenizer_name {name!r}: vocabulary has only {len(tokenizer)} tokens; "
                         "check that the folder holds tokenizer.json or a valid vocab.txt")
    return tokenizer


def load_config(args: ModelArgs):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(args.config_name or args.model_name_or_path)


def check_positions(config, tokenizer, max_seq_length: int) -> None:
    """Refuse windows longer than the model can embed, before featurisation rather than at the first long batch."""
    limits = {"position embeddings": getattr(config, "max_position_embeddings", None)}
    if 0 < tokenizer.model_max_length < 1_000_000:  # unset lengths are stored as a huge sentinel
        limits["tokenizer model_max_length"] = tokenizer.model_max_length
    for what, limit in limits.items():
        if limit is not None and max_seq_length > limit:
            raise ConfigError(f"--max_seq_length {max_seq_length}: the model has {limit} {what} "
                              f"({getattr(config, '_name_or_path', '') or config.model_type}); use at most {limit}")


def load_model(args: ModelArgs, tokenizer, config):
    """Pretrained weights by default; random init from --config_name (offline use, benchmarks).

    Master weights are fp32 whatever the checkpoint stores: transformers 5 loads a checkpoint in its
    stored dtype, so an fp16/bf16 upload would otherwise train in half precision (autocast is how
    mixed precision is done here).
    """
    import torch
    from transformers import AutoModelForQuestionAnswering

    if args.config_name:
        config.vocab_size = max(config.vocab_size, len(tokenizer))
        model = AutoModelForQuestionAnswering.from_config(config, attn_implementation=args.attn_implementation,
                                                          dtype=torch.float32)
    else:
        model = AutoModelForQuestionAnswering.from_pretrained(
            args.model_name_or_path, config=config, attn_implementation=args.attn_implementation,
            dtype=torch.float32,
        )
    if model.config.vocab_size < len(tokenizer):
        raise ConfigError(f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
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


def import_model_code(config) -> None:
    """Import the QA model class's module now. It is ~110 MB of Python for BERT, which would otherwise land
    in host memory measured as the model's own (HostMemory.mark_baseline comes right after this)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_QUESTION_ANSWERING_MAPPING

    MODEL_FOR_QUESTION_ANSWERING_MAPPING[type(config)]
