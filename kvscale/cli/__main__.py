"""`python -m kvscale.cli ARGS`: the same as the `kvscale` console script."""

from kvscale.cli import main

main()
