"""`python -m specdec_cli`: the same entry point as the `specdec` console script."""

from .commands.app import main

if __name__ == "__main__":
    main()
