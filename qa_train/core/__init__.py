"""What every layer may use: exit codes and the one-line error, stop requests, the collector's pause at start, the
rank's exit without the interpreter's teardown."""
