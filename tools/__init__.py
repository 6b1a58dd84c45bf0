"""Maintainer tools (documentation generators); not part of the installed package."""
