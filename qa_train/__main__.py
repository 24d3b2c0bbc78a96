"""`python -m qa_train [flags]`, also under `accelerate launch ... -m qa_train`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from qa_train.config import ConfigError, parse_args

    try:
        args = parse_args(argv)
    except ConfigError as err:
        print(f"qa_train: error: {err}", file=sys.stderr)
        return 2
    from qa_train.distributed import LaunchError
    from qa_train.run import run

    try:
        run(args)
    except (LaunchError, ConfigError) as err:
        print(f"qa_train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
