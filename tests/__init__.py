"""The test suite, by subject (STYLE.md, Tests)."""
