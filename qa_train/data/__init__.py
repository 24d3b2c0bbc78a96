"""SQuAD examples -> checked records -> token windows -> padded batches and loaders."""
