"""`python -m console`: the `courier` command, for a child process started with this interpreter."""

from console.cli import main

main()
