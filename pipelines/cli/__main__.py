"""``python -m icelog.pipelines.cli``: the same command line as the ``icelog`` script."""

from icelog.pipelines.cli import main

if __name__ == "__main__":
    main()
