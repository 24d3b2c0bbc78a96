"""Typed settings, the command line that fills them, and the output-dir contract."""
