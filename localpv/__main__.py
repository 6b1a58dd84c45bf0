"""Allow `python -m localpv`."""

from localpv.cli import main

main()
