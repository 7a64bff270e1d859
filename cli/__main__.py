"""`python -m straitmq.cli`: the `strait` command line."""

from straitmq.cli.main import main

main()
