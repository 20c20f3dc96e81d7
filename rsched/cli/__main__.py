"""`python -m rsched.cli`: what the `rsched` command runs."""

from rsched.cli.main import main

main()
