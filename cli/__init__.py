"""The `strait` command line: the top floor, it may import every other package."""
