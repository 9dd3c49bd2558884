"""``python -m pipelines.cli``: the same command line as the ``icelog`` script."""

from pipelines.cli import main

if __name__ == "__main__":
    main()
