"""Answers from logits, and SQuAD v1.1 / v2.0 scoring."""
