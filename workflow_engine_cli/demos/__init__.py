"""Runnable examples; each is imported and run by the test suite so it never rots."""
