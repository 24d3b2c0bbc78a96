"""The model and tokenizer, the optimizer and the schedule."""
