"""qa-train: SQuAD fine-tuning of BERT-style encoders under any data-parallel strategy."""

__version__ = "0.1.0"
