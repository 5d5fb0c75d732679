"""The command line's exit codes: a contract with scripts, so each keeps its meaning.

  0  done (the run finished, or the command succeeded)
  1  the run failed (or the output could not be written: a full disk)
  2  bad usage or invalid input (malformed JSON, an answer of the wrong type, an ambiguous id)
  3  paused: the run waits for input (answer with ``respond``, continue with ``resume``)
  4  not found: unknown run, request or workflow
  5  conflict: already answered differently, cancelled, finished, or run by another worker
  6  storage problem: the database is unusable, damaged or locked, or a record is corrupt
  7  the server cannot listen: the address is in use or not allowed
141  the reader of the output went away (``| head``): stopped quietly, as SIGPIPE would
"""

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_STORAGE, EXIT_CANNOT_LISTEN = 4, 5, 6, 7
EXIT_BROKEN_PIPE = 141
"""Whoever read the output stopped reading (``| head``): the command stops quietly, with the
status a shell gives a tool that SIGPIPE ended (128 + 13)."""
